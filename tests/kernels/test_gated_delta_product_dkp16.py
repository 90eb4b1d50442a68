"""The ``dkp16`` flag (tenth session, in the default): the direct dk that dqkw hands to wy_bwd stored in k's
dtype.

CPU (interpreter, fp16): dqkw's direct dk is its fp32 result rounded once (both gradient modules), the other
outputs are unchanged; end to end against the fp64 oracle (fp16, documents); a no-op for fp32 inputs.
GPU: bf16 at the issue's tolerances, including n_h = 1 at K = 128 (where a 16-bit δ in dqkw miscompiled).
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product import grads, grads_sliced
from titan_delta_kernels.gated_delta_product.options import DEFAULT_FLAGS, parse_options
from titan_delta_kernels.gated_delta_product.output import dv_local
from titan_delta_kernels.gated_delta_product.state import state_bwd, state_fwd
from titan_delta_kernels.gated_delta_product.wy_series import wy_fwd_series

from .test_gated_delta_product_fast import (
    check_gpu_bf16,
    check_gpu_varlen_and_gate_extremes,
    chunked_inputs,
    variant_kernel,
)
from .test_gated_delta_product_triton import check_against_reference, make_inputs, run_with_grads

BEFORE = "save_states+fastwy+bf16x3+kslice+wyseries"  # the default before dkp16


def backward_inputs(n_h: int, dtype: torch.dtype = torch.float16, K: int = 32, T: int = 70, device="cpu"):
    """Everything dqkw takes, from the forward and reverse passes of fresh inputs."""
    torch.manual_seed(31 + n_h)
    x, geo, seqs = chunked_inputs(1, T, n_h, K, K, device=device, dtype=dtype)
    _, w, u = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs)
    hs, delta, _ = state_fwd(x["k"], w, u, x["g"], x["initial_state"], geo, seqs)
    d_out = torch.randn(1, T, 2, K, device=device).to(dtype)
    dvl = dv_local(x["q"], x["k"], x["g"], d_out, 0.25, geo, seqs)
    dhs, dd, _ = state_bwd(x["q"], x["k"], w, x["g"], d_out, None, dvl, 0.25, geo, seqs)
    return (x["q"], x["k"], x["g"], delta, hs, dhs, dd, d_out, 0.25, geo, seqs)


@pytest.mark.parametrize("module", [grads, grads_sliced])
@pytest.mark.parametrize("n_h", [1, 3])
def test_direct_dk_is_rounded_once(module, n_h):
    args = backward_inputs(n_h)
    base = module.dqkw(*args)
    half = module.dqkw(*args, dk_part_dtype=torch.float16)
    assert base[1].dtype == torch.float32 and half[1].dtype == torch.float16
    assert torch.equal(half[1], base[1].to(torch.float16))
    for a, b in zip(half[:1] + half[2:], base[:1] + base[2:], strict=True):
        assert torch.equal(a, b)


def test_dkp16_matches_reference_fp16_varlen():
    torch.manual_seed(41)
    cu = torch.tensor([0, 9, 9, 30], dtype=torch.int32)
    inputs = make_inputs(1, 30, 2, 32, 16, 2, num_seqs=3, dtype=torch.float16)
    check_against_reference(inputs, 2, cu, 5e-3, 1e-2, 2e-2, kernel=variant_kernel("default"))
    inputs = make_inputs(2, 70, 2, 16, 16, 1, dtype=torch.float16, gated=False)
    check_against_reference(inputs, 1, None, 5e-3, 1e-2, 2e-2, kernel=variant_kernel("default"))


def test_dkp16_is_a_no_op_for_fp32():
    torch.manual_seed(4)
    inputs = make_inputs(1, 23, 2, 16, 16, 2)
    d_out = torch.randn(1, 23, 2, 16, dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    assert parse_options("default").dkp16
    without = "+".join(f for f in DEFAULT_FLAGS if f != "dkp16")
    a = run_with_grads(variant_kernel(without), inputs, 2, None, d_out, d_final)
    b = run_with_grads(variant_kernel("default"), inputs, 2, None, d_out, d_final)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(a[2][n], b[2][n]) for n in a[2])


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K", "gated"),
                         [(1, 128, False), (1, 128, True), (2, 64, True), (3, 128, True)])  # fmt: skip
def test_gpu_dkp16_bf16_matches_reference(n_h, K, gated):
    """(The default path's own GPU tests cover it too; these add n_h = 1, K = 128 with and without gates.)"""
    if gated:
        check_gpu_bf16("default", n_h, K)
    else:
        inputs = make_inputs(4, 200, 4, K, K, n_h, gated=False, device="cuda", dtype=torch.bfloat16)
        inputs["beta"] = inputs["beta"].to(torch.bfloat16)
        check_against_reference(inputs, n_h, None, 5e-3, 1e-2, 2e-2, kernel=variant_kernel("default"))


@pytest.mark.gpu
def test_gpu_dkp16_varlen_and_gate_extremes():
    check_gpu_varlen_and_gate_extremes("default")


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2])
def test_gpu_dqkw_outputs_do_not_depend_on_the_direct_dk_dtype(n_h):
    """dqkw with a bf16 direct dk gives the fp32 run's dq, ∂L/∂W and gate terms bitwise (K = 128)."""
    args = backward_inputs(n_h, torch.bfloat16, K=128, T=200, device="cuda")
    base = grads_sliced.dqkw(*args)
    half = grads_sliced.dqkw(*args, dk_part_dtype=torch.bfloat16)
    assert torch.equal(half[1], base[1].to(torch.bfloat16))
    for a, b in zip(half[:1] + half[2:], base[:1] + base[2:], strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_gpu_dqkw_with_a_16bit_delta(n_h):
    """A bf16 δ (lowp, lowp_safe) gives the fp32 δ's results: dqkw rounds δ to k's dtype on load. Regression
    test for the miscompiled 2-stage pipeline at K = 128 (∂L/∂W 11% off at n_h = 1), now run with 1 stage."""
    args = list(backward_inputs(n_h, torch.bfloat16, K=128, T=200, device="cuda"))
    base = grads_sliced.dqkw(*args, dk_part_dtype=torch.bfloat16)
    args[3] = args[3].to(torch.bfloat16)
    half = grads_sliced.dqkw(*args, dk_part_dtype=torch.bfloat16)
    for a, b in zip(half, base, strict=True):
        assert torch.equal(a, b)
