"""Opt-in forward options of the chunked GDP kernels (ninth session): the forward state pass's product operands
(``kdx2``, ``fwdx3``: ``state.FWD_MODES``) and output_fwd's K slice and V tile (``obk``, ``obv``).

CPU (interpreter): the split modes against mode 0 on 16-bit inputs (fp16 halves there, fp32 products exact,
so a split must land within ~2^-16 of mode 0); every option end to end against the fp64 oracle in fp32 (the
split modes fall back to mode 0 for fp32 inputs, the slices do not), odd T and documents.
GPU: bf16 at the issue's tolerances.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout
from titan_delta_kernels.gated_delta_product.options import parse_options

from .test_gated_delta_product_fast import ISSUE_TOL, variant_kernel
from .test_gated_delta_product_triton import check_against_reference, make_inputs


def state_fwd_inputs(dtype: torch.dtype, n_h: int, T: int = 40, K: int = 16, V: int = 32, gated: bool = True):
    """k and a fresh initial state in ``dtype``, fp32 W and U as the default path makes them."""
    from titan_delta_kernels.gated_delta_product import wy_fwd

    x = make_inputs(1, T, 2, K, V, n_h, dtype=dtype, gated=gated)
    geo = chunk_geometry(n_h)
    seqs = sequence_layout(1, T, None, geo, torch.device("cpu"))
    _, w, u = wy_fwd.wy_fwd(x["k"], x["v"], x["beta"], x["g"], geo, seqs, torch.float32)
    return (x["k"], w, u, x["g"], x["initial_state"], geo, seqs)


def test_fwd_modes_parse():
    assert [parse_options(v).fwd_mode() for v in ("default", "kdx2", "fwdx3", "kdx2+fwdx3")] == [0, 2, 3, 3]
    assert parse_options("default+obk=64+obv=128").launch_text().endswith("+obk=64+obv=128")
    with pytest.raises(ValueError, match="obk"):
        parse_options("default+obk=48")


@pytest.mark.parametrize(("n_h", "gated"), [(1, True), (2, False), (3, True)])
def test_state_fwd_split_modes_match_mode_0(n_h, gated):
    from titan_delta_kernels.gated_delta_product.state import state_fwd

    torch.manual_seed(10 + n_h)
    args = state_fwd_inputs(torch.float16, n_h, gated=gated)
    out = {m: state_fwd(*args, fwd_mode=m) for m in (0, 2, 3)}
    assert not torch.equal(out[0][1], out[3][1])  # mode 3 really splits W·S (δ moves at rounding level)
    for i, name in enumerate(("chunk_states", "delta", "final_state")):
        ref = out[0][i].double()
        for m in (2, 3):
            rel = ((out[m][i].double() - ref).norm() / ref.norm()).item()
            # chunk states are stored in fp16 (k's dtype): a split may flip their last bit
            assert rel < (2e-3 if name == "chunk_states" else 1e-4), (name, m, rel)


def test_state_fwd_modes_are_mode_0_for_fp32_and_refuse_others():
    from titan_delta_kernels.gated_delta_product.state import state_fwd

    torch.manual_seed(3)
    args = state_fwd_inputs(torch.float32, 2)
    base = state_fwd(*args)
    for m in (2, 3):
        assert all(torch.equal(a, b) for a, b in zip(base, state_fwd(*args, fwd_mode=m), strict=True))
    with pytest.raises(ValueError, match="fwd_mode"):
        state_fwd(*args, fwd_mode=1)


@pytest.mark.parametrize(("variant", "n_h", "T", "K"), [
    ("default+obk=32", 2, 37, 64), ("default+obk=64+obv=32", 3, 23, 128), ("default+obv=128+kdx2", 1, 21, 32),
])  # fmt: skip
def test_forward_options_match_reference(variant, n_h, T, K):
    torch.manual_seed(n_h * T)
    inputs = make_inputs(2, T, 2, K, 32, n_h)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5, kernel=variant_kernel(variant))


def test_forward_options_varlen_fp16():
    """Documents (one empty) with fp16 inputs: the split modes and the K slices on one path."""
    torch.manual_seed(7)
    cu = torch.tensor([0, 9, 9, 30], dtype=torch.int32)
    inputs = make_inputs(1, 30, 2, 32, 16, 2, num_seqs=3, dtype=torch.float16)
    check_against_reference(inputs, 2, cu, 5e-3, 1e-2, 2e-2, kernel=variant_kernel("default+fwdx3+obk=16"))


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("variant", "n_h", "K"), [
    ("default+kdx2", 2, 128), ("default+fwdx3", 3, 64), ("default+obk=64+obv=128", 2, 128),
    ("default+kdx2+obk=64", 1, 128),
])  # fmt: skip
def test_gpu_forward_options_bf16_match_reference(variant, n_h, K):
    inputs = make_inputs(2, 257, 4, K, K, n_h, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0.0))
    inputs["beta"] = inputs["beta"].to(torch.bfloat16)
    check_against_reference(inputs, n_h, None, *ISSUE_TOL, kernel=variant_kernel(variant))


@pytest.mark.gpu
def test_gpu_forward_options_varlen_and_gates_near_one():
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, 3, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 3, cu, *ISSUE_TOL, kernel=variant_kernel("default+fwdx3+obk=64"))
    inputs = make_inputs(2, 250, 4, 64, 64, 2, gated=False, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 2, None, *ISSUE_TOL, kernel=variant_kernel("default+kdx2+obv=128"))
