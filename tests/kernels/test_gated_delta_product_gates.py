"""Log gates of the chunked kernels: ``gpre`` (the state passes read stored prefix sums) and padding steps.

CPU (interpreter): ``gpre`` is bitwise the default, with and without recomputed states, documents of odd
lengths (one empty), n_h = 1..5, strongly decaying gates; the stored sums are ``chunk_log_gates``' own;
128-step blocks (n_h >= 5) stay finite and right with gates near 0 (g ~ −30 per token used to overflow a
padding row's exponent into NaN). GPU: bitwise the default in bf16 at real shapes.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout
from titan_delta_kernels.gated_delta_product.gates import chunk_gate_prefix

from .test_gated_delta_product_fast import variant_kernel
from .test_gated_delta_product_triton import check_against_reference, make_inputs, run_with_grads


def reference_prefix(g: torch.Tensor, n_h: int, cu: list[int] | None) -> torch.Tensor:
    """Per step: the cumulative log gate of its token within its chunk (chunks restart at documents)."""
    B, T, H = g.shape
    C = chunk_geometry(n_h).tokens_per_chunk
    bounds = [(b, 0, T) for b in range(B)] if cu is None else [(0, s, e) for s, e in itertools.pairwise(cu)]
    out = torch.empty(B, T, H, dtype=torch.float64)
    for b, s, e in bounds:
        for c0 in range(s, e, C):
            out[b, c0:min(c0 + C, e)] = g[b, c0:min(c0 + C, e)].double().cumsum(0)
    return out.repeat_interleave(n_h, dim=1)


@pytest.mark.parametrize(("n_h", "cu"), [(1, None), (2, [0, 13, 13, 50, 61]), (3, None), (5, [0, 40, 61])])
def test_stored_prefix_sums(n_h, cu):
    g = -torch.rand(1, 61, 2) * 30
    geo = chunk_geometry(n_h)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    seqs = sequence_layout(1, 61, cu_t, geo, g.device)
    got = chunk_gate_prefix(g, geo, seqs, 61 * n_h)
    assert got.shape == (1, 61 * n_h, 2) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference_prefix(g, n_h, cu), rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize(("n_h", "T", "cu"), [(1, 70, None), (2, 45, [0, 9, 9, 40, 45]), (3, 50, None),
                                              (5, 40, None)])  # fmt: skip
@pytest.mark.parametrize("base", ["default", "plain"])
def test_gpre_is_bitwise_the_default(n_h, T, cu, base):
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    inputs = make_inputs(1, T, 2, 16, 16, n_h, num_seqs=None if cu is None else len(cu) - 1,
                         gate_range=(-30.0, 0.0))  # fmt: skip
    d_out = torch.randn(1, T, 2, 16, dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    a = run_with_grads(variant_kernel(base), inputs, n_h, cu_t, d_out, d_final)
    b = run_with_grads(variant_kernel(base + "+gpre"), inputs, n_h, cu_t, d_out, d_final)
    assert torch.isfinite(b[0]).all() and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(a[2][n], b[2][n]) for n in a[2])


@pytest.mark.parametrize("n_h", [5, 6])
@pytest.mark.parametrize("gate_range", [(-40.0, -20.0), (-1e-6, 0.0)])
def test_128_step_blocks_with_extreme_gates(n_h, gate_range):
    """n_h >= 5 (128-step blocks, padded past C·n_h steps) against the fp64 oracle at gates near 0 and 1."""
    inputs = make_inputs(1, 37, 2, 16, 16, n_h, gate_range=gate_range)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5, dg_floor=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K"), [(2, 128), (3, 64)])
def test_gpu_gpre_is_bitwise_the_default(n_h, K):
    inputs = make_inputs(2, 513, 4, K, K, n_h, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0.0))
    d_out = torch.randn(2, 513, 4, K, device="cuda", dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    a = run_with_grads(variant_kernel("default"), inputs, n_h, None, d_out, d_final)
    b = run_with_grads(variant_kernel("default+gpre"), inputs, n_h, None, d_out, d_final)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(a[2][n], b[2][n]) for n in a[2])
