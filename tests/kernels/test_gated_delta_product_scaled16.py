"""The scaled-fp16 state-pass products (tenth session): ``ws16`` (forward W·S), ``kd16`` (forward Kᵀδ),
``wd16`` (reverse Wᵀ·dδ). Each operand is scaled by one power of two per row (first operand) or column
(second) into fp16's range, multiplied in fp16 with fp32 accumulation, and unscaled exactly
(``_common.scaled_f16``).

CPU (interpreter: fp16 inputs, exact fp32 products on the default path): each product lands within fp16
rounding (~2^-11) of the default's, also with U scaled by 1e-7 and 1e5 (where unscaled fp16 would underflow
or overflow) and ∂L/∂o by 1e-3 and 1e3; end to end against the fp64 oracle (fp16, documents); no-op for fp32
inputs.
GPU: bf16 at the issue's tolerances.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product.options import DEFAULT_FLAGS, parse_options
from titan_delta_kernels.gated_delta_product.output import dv_local
from titan_delta_kernels.gated_delta_product.state import state_bwd, state_fwd
from titan_delta_kernels.gated_delta_product.wy_series import wy_fwd_series

from .test_gated_delta_product_fast import (
    check_gpu_bf16,
    check_gpu_far_from_unit_scale,
    check_gpu_varlen_and_gate_extremes,
    chunked_inputs,
    variant_kernel,
)
from .test_gated_delta_product_triton import check_against_reference, make_inputs, run_with_grads

# The scaled products act on fp32 W: the default's flags without w16 (in the default since session 11).
FP32_W = "+".join(f for f in DEFAULT_FLAGS if f != "w16")
ALL16 = FP32_W + "+ws16+kd16+wd16"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def transform(n_h: int, gated: bool, T: int = 150):
    """At least three chunks at every n_h, so that Kᵀδ reaches a later chunk's δ."""
    torch.manual_seed(17 + n_h)
    x, geo, seqs = chunked_inputs(1, T, n_h, 32, 16, dtype=torch.float16)
    if not gated:
        x["g"] = None
    _, w, u = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs)
    return x, geo, seqs, w, u


def test_flags_parse():
    opts = parse_options("default+ws16+kd16+wd16")
    assert (opts.fwd16(), opts.wt_mode()) == (3, 4)
    assert (parse_options("default+kd16").fwd16(), parse_options("default").fwd16()) == (2, 0)
    assert parse_options("default").wt_mode() == 3
    with pytest.raises(ValueError, match="fwd16"):
        x, geo, seqs, w, u = transform(1, True)
        state_fwd(x["k"], w, u, x["g"], None, geo, seqs, fwd16=4)


@pytest.mark.parametrize(("n_h", "gated"), [(1, True), (2, False), (3, True)])
@pytest.mark.parametrize("u_scale", [1.0, 1e-7, 1e5])
def test_forward_state_pass(n_h, gated, u_scale):
    """Each bit alone and both: δ and the final state within fp16 rounding of the exact-fp32 default."""
    x, geo, seqs, w, u = transform(n_h, gated)
    u = u * u_scale
    h0 = None if x["initial_state"] is None else x["initial_state"] * u_scale
    base = state_fwd(x["k"], w, u, x["g"], h0, geo, seqs)
    for bits in (1, 2, 3):
        got = state_fwd(x["k"], w, u, x["g"], h0, geo, seqs, fwd16=bits)
        assert not torch.equal(got[1], base[1]), bits  # the fp16 products ran
        assert rel(got[1], base[1]) < 2e-3, bits
        assert rel(got[2], base[2]) < 2e-3, bits
        if u_scale == 1.0:  # chunk states are stored in fp16 here: at 1e-7 the storage itself is subnormal
            assert rel(got[0].float(), base[0].float()) < 3e-3, bits


@pytest.mark.parametrize(("n_h", "gated"), [(1, False), (2, True), (3, True)])
@pytest.mark.parametrize("dd_scale", [1.0, 1e-3, 1e3])
def test_reverse_state_pass(n_h, gated, dd_scale):
    """wt_mode 4 (wd16) within fp16 rounding of mode 0 (fp32 operands: exact products here). Away from unit
    scale only ∂L/∂S₀ (fp32) is compared: the other two are stored in fp16 here, and the pass rounds ∂L/∂S to
    k's dtype (fp16 here) for K·∂L/∂S, which is subnormal further down (bf16 on the GPU has no such limit)."""
    x, geo, seqs, w, _ = transform(n_h, gated)
    torch.manual_seed(3)
    d_out = (torch.randn(1, 150, 2, 16) * dd_scale).to(torch.float16)
    dvl = dv_local(x["q"], x["k"], x["g"], d_out, 0.25, geo, seqs)
    tail = (x["g"], d_out, None, dvl, 0.25, geo, seqs)
    exact = state_bwd(x["q"], x["k"], w, *tail, wt_mode=0)
    got = state_bwd(x["q"], x["k"], w, *tail, wt_mode=4)
    assert not torch.equal(got[2], exact[2])  # the fp16 product ran
    for name, a, b in zip(("d_chunk_states", "d_delta", "d_h0"), got, exact, strict=True):
        if dd_scale == 1.0 or name == "d_h0":
            assert rel(a.float(), b.float()) < 3e-3, name


def test_all16_matches_reference_fp16_varlen():
    torch.manual_seed(23)
    cu = torch.tensor([0, 9, 9, 30], dtype=torch.int32)
    inputs = make_inputs(1, 30, 2, 32, 16, 2, num_seqs=3, dtype=torch.float16)
    check_against_reference(inputs, 2, cu, 5e-3, 1e-2, 2e-2, kernel=variant_kernel(ALL16))
    inputs = make_inputs(2, 21, 2, 16, 16, 3, dtype=torch.float16, gated=False)
    check_against_reference(inputs, 3, None, 5e-3, 1e-2, 2e-2, kernel=variant_kernel(ALL16))


def test_all16_is_a_no_op_for_fp32():
    torch.manual_seed(4)
    inputs = make_inputs(1, 23, 2, 16, 16, 2)
    d_out = torch.randn(1, 23, 2, 16, dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    a = run_with_grads(variant_kernel(FP32_W), inputs, 2, None, d_out, d_final)
    b = run_with_grads(variant_kernel(ALL16), inputs, 2, None, d_out, d_final)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(a[2][n], b[2][n]) for n in a[2])


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize("variant", [ALL16, FP32_W + "+ws16", FP32_W + "+kd16", FP32_W + "+wd16"])
@pytest.mark.parametrize(("n_h", "K"), [(1, 128), (2, 64), (3, 128)])
def test_gpu_scaled16_bf16_matches_reference(variant, n_h, K):
    check_gpu_bf16(variant, n_h, K)


@pytest.mark.gpu
def test_gpu_scaled16_varlen_and_gate_extremes():
    check_gpu_varlen_and_gate_extremes(ALL16)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1e-6, 1e4])
def test_gpu_scaled16_far_from_unit_scale(scale):
    check_gpu_far_from_unit_scale(ALL16, scale)
