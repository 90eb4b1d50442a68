"""Padding steps of 128-step blocks (n_h >= 5: C·n_h steps padded to 128) with strongly decaying gates.

``chunk_log_gates`` gives a padding step the chunk's total log gate. It used to give steps past BC tokens 0,
and at g ~ −30 per token a padding row's exponent e^{G_r − G_j} (~e^{+480}) overflowed the UT transform's
decay; 0·inf then turned the whole chunk into NaN. CPU (interpreter, fp32): against the fp64 oracle at gates
near 0 and near 1, n_h = 5 and 6; the steps' G of a padded chunk.
"""

from __future__ import annotations

import pytest
import torch

from .test_gated_delta_product_triton import check_against_reference, make_inputs


@pytest.mark.parametrize("n_h", [5, 6])
@pytest.mark.parametrize("gate_range", [(-40.0, -20.0), (-1e-6, 0.0)])
def test_128_step_blocks_with_extreme_gates(n_h, gate_range):
    inputs = make_inputs(1, 37, 2, 16, 16, n_h, gate_range=gate_range)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5, dg_floor=1e-3)


def test_128_step_blocks_varlen_with_extreme_gates():
    cu = torch.tensor([0, 5, 5, 30, 37], dtype=torch.int32)
    inputs = make_inputs(1, 37, 2, 16, 16, 5, num_seqs=4, gate_range=(-40.0, -20.0))
    check_against_reference(inputs, 5, cu, 1e-5, 1e-5, 1e-5, dg_floor=1e-3)
