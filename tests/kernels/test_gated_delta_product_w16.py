"""``w16``: W and U stored in fp16 with one power-of-two scale per row (``_common.row_scaled_f16``).

CPU (interpreter, fp16 inputs): the series transform's scaled rows against its fp32 W and U (within fp16
rounding, scales exact powers of two, the same ones as the PyTorch twin's); both state passes on row-scaled W
and U against the same passes on the fp32 W and U these stand for (the forward's δ and final state within
fp16 rounding, also with U scaled by 1e-7 and 1e5, where unscaled fp16 would underflow or overflow); end to
end against the fp64 oracle (fp16, odd T, documents, n_h = 1..5, with and without recomputed states); a no-op
for fp32 inputs; the custom op's extra outputs and its fake implementation. GPU: bf16 at the issue's
tolerances, far from unit scale, the default on lowp's failed configurations, and agreement with fp32 W, U.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product import cost, state
from titan_delta_kernels.gated_delta_product._common import row_scaled_f16
from titan_delta_kernels.gated_delta_product.chunk import gdp_chunk_fwd
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
from .test_gated_delta_product_lowp_error import GPU_CONFIGS, check_bf16_config
from .test_gated_delta_product_triton import NAMES, check_against_reference, make_inputs, run_with_grads

W16 = "default+w16"  # w16 is in the default since the eleventh session; the flag keeps the tests explicit
NO_W16 = "+".join(f for f in DEFAULT_FLAGS if f != "w16")  # the default's other flags
FP16_TOL = (5e-3, 1e-2, 2e-2)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def unscaled(x16: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x16.float() * scale[..., None]


def transform(n_h: int, gated: bool, T: int = 150, K: int = 32, V: int = 16):
    x, geo, seqs = chunked_inputs(1, T, n_h, K, V, dtype=torch.float16)
    if not gated:
        x["g"] = None
    t32, w, u = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs)
    t16, w16, u16, w_scale, u_scale = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs,
                                                    row_scaled=True)  # fmt: skip
    assert torch.equal(t16, t32)
    return x, geo, seqs, (w, u), (w16, u16, w_scale, u_scale)


def test_flag_parses():
    assert parse_options(W16).w16 and parse_options("default").w16 and not parse_options(NO_W16).w16
    assert cost.STATE_FWD_BLOCK_V_ROW_SCALED == state.STATE_FWD_BLOCK_V_ROW_SCALED


def test_forward_tile_follows_storage():
    """The forward pass takes 64 columns per program on row-scaled W at K <= 64 (``sbv`` overrides it)."""
    cases = ((64, False, None, 4), (64, True, None, 2), (64, True, 32, 4), (128, True, None, 4),
             (128, True, 64, 2))  # fmt: skip
    for K, w16, sbv, tiles in cases:
        costs = cost.stage_costs(2, 64, 2, K, 128, 2, state_block_v=sbv, w16=w16)
        assert costs["state_fwd"].programs == 2 * 2 * tiles, (K, w16, sbv)


def test_row_scaled_f16_twin():
    x = torch.randn(3, 5, 64) * torch.logspace(-30, 30, 5)[None, :, None]
    x[0, 0] = 0.0
    x16, scale = row_scaled_f16(x)
    assert x16.dtype == torch.float16 and scale.dtype == torch.float32 and scale.shape == x.shape[:-1]
    assert torch.equal(torch.frexp(scale).mantissa.abs(), torch.full_like(scale, 0.5))  # powers of two
    top = x16.float().abs().amax(-1)
    assert ((top >= 2.0**14) & (top < 2.0**15))[1:].all()  # each row's largest in [2^14, 2^15)
    assert (x16[0, 0] == 0).all()
    assert rel(unscaled(x16, scale), x) < 2.0**-11


@pytest.mark.parametrize(("n_h", "gated", "K"), [(1, True, 32), (2, False, 64), (3, True, 32), (4, True, 16)])
def test_series_transform_writes_scaled_rows(n_h, gated, K):
    _, _, _, (w, u), (w16, u16, w_scale, u_scale) = transform(n_h, gated, K=K, V=K)
    assert (w16.dtype, u16.dtype, w_scale.dtype) == (torch.float16, torch.float16, torch.float32)
    for name, x16, scale, ref in (("W", w16, w_scale, w), ("U", u16, u_scale, u)):
        assert rel(unscaled(x16, scale), ref) < 2.0**-11, name
        twin16, twin_scale = row_scaled_f16(ref)
        assert torch.equal(scale, twin_scale), name  # same powers of two as the PyTorch twin
        assert (x16.float() - twin16.float()).abs().max() <= 1.0, name  # within one fp16 step of 2^14..2^15


@pytest.mark.parametrize(("n_h", "gated"), [(1, True), (2, False), (3, True)])
@pytest.mark.parametrize("u_scale_by", [1.0, 1e-7, 1e5])
def test_forward_state_pass(n_h, gated, u_scale_by):
    """δ and the final state within fp16 rounding of the pass on the fp32 W and U (exact products here)."""
    x, geo, seqs, (w, u), (w16, u16, w_scale, u_scale) = transform(n_h, gated)
    h0 = None if x["initial_state"] is None else x["initial_state"] * u_scale_by
    base = state_fwd(x["k"], w, u * u_scale_by, x["g"], h0, geo, seqs)
    got = state_fwd(x["k"], w16, u16, x["g"], h0, geo, seqs, w_scale=w_scale, u_scale=u_scale * u_scale_by)
    assert got[1].dtype == torch.float32  # δ stays fp32
    assert rel(got[1], base[1]) < 2e-3
    assert rel(got[2], base[2]) < 2e-3
    if u_scale_by == 1.0:  # chunk states are stored in fp16 here: at 1e-7 the storage itself is subnormal
        assert rel(got[0].float(), base[0].float()) < 3e-3


@pytest.mark.parametrize(("n_h", "gated"), [(1, False), (2, True), (3, True)])
@pytest.mark.parametrize("wt_mode", [0, 3])
def test_reverse_state_pass(n_h, gated, wt_mode):
    """Row-scaled W against the fp32 W it stands for, in the modes that read fp32 W (mode 3 is the
    default's bf16x3; fp16 halves under the interpreter)."""
    x, geo, seqs, (w, _), (w16, _, w_scale, _) = transform(n_h, gated)
    d_out = torch.randn(1, 150, 2, 16).to(torch.float16)
    dvl = dv_local(x["q"], x["k"], x["g"], d_out, 0.25, geo, seqs)
    tail = (x["g"], d_out, None, dvl, 0.25, geo, seqs)
    base = state_bwd(x["q"], x["k"], w, *tail, wt_mode=wt_mode)
    got = state_bwd(x["q"], x["k"], w16, *tail, wt_mode=wt_mode, w_scale=w_scale)
    for name, a, b in zip(("d_chunk_states", "d_delta", "d_h0"), got, base, strict=True):
        assert rel(a.float(), b.float()) < 3e-3, name


def test_bad_scales_are_refused():
    x, geo, seqs, (w, _), (w16, u16, w_scale, u_scale) = transform(2, True)
    with pytest.raises(ValueError, match="row-scaled W must be fp16"):
        state_fwd(x["k"], w, u16, x["g"], None, geo, seqs, w_scale=w_scale, u_scale=u_scale)
    with pytest.raises(ValueError, match="row-scaled U must be fp16 with fp32 scales of shape"):
        state_fwd(x["k"], w16, u16, x["g"], None, geo, seqs, w_scale=w_scale, u_scale=u_scale[:, :-1])
    with pytest.raises(ValueError, match="go together"):
        state_fwd(x["k"], w16, u16, x["g"], None, geo, seqs, w_scale=w_scale)


@pytest.mark.parametrize(("n_h", "T", "gated"), [(1, 70, True), (2, 45, False), (3, 50, True), (4, 33, True),
                                                 (5, 37, True)])  # fmt: skip
def test_w16_matches_reference_fp16(n_h, T, gated):
    """n_h = 5 takes 128-step blocks: wy_fwd's fp32 W and U are scaled after it (row_scaled_f16)."""
    inputs = make_inputs(2, T, 2, 32, 16, n_h, dtype=torch.float16, gated=gated)
    check_against_reference(inputs, n_h, None, *FP16_TOL, kernel=variant_kernel(W16))


@pytest.mark.parametrize("variant", [W16, "plain+wyseries+w16", "default+w16+lowp_safe", "save_states+w16"])
def test_w16_varlen_matches_reference_fp16(variant):
    """Documents (one empty) with states; ``plain`` recomputes the states from the row-scaled U in the
    backward; ``save_states+w16`` takes the transform without the series kernel (scaled afterwards)."""
    cu = torch.tensor([0, 9, 9, 40, 47], dtype=torch.int32)
    inputs = make_inputs(1, 47, 2, 32, 16, 2, num_seqs=4, dtype=torch.float16)
    check_against_reference(inputs, 2, cu, *FP16_TOL, kernel=variant_kernel(variant))


def test_w16_close_to_default_fp16():
    """Same inputs, with and without w16: the outputs move by fp16's rounding of W and U, no more."""
    inputs = make_inputs(1, 77, 2, 32, 32, 2, dtype=torch.float16)
    d_out = torch.randn(1, 77, 2, 32, dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    a = run_with_grads(variant_kernel(NO_W16), inputs, 2, None, d_out, d_final)
    b = run_with_grads(variant_kernel(W16), inputs, 2, None, d_out, d_final)
    assert rel(b[0], a[0]) < 2e-3 and rel(b[1], a[1]) < 2e-3
    for name in a[2]:
        assert rel(b[2][name], a[2][name]) < 5e-3, name


def test_w16_is_a_no_op_for_fp32():
    inputs = make_inputs(1, 23, 2, 16, 16, 2)
    d_out = torch.randn(1, 23, 2, 16, dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    a = run_with_grads(variant_kernel(NO_W16), inputs, 2, None, d_out, d_final)
    b = run_with_grads(variant_kernel(W16), inputs, 2, None, d_out, d_final)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(a[2][n], b[2][n]) for n in a[2])


@pytest.mark.parametrize("options", ["default+w16", NO_W16])
def test_custom_op_outputs_and_fake(options):
    """W and U fp16 with [B, L, H] fp32 scales under w16 (empty scales otherwise); the fake agrees."""
    inputs = make_inputs(1, 10, 2, 16, 32, 3, num_seqs=2, dtype=torch.float16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    args = (*(inputs[n] for n in NAMES), cu, 3, 0.5, True, False, options)
    torch.library.opcheck(gdp_chunk_fwd, args, test_utils=("test_schema", "test_faketensor"))
    _, _, _, w, u, _, _, w_scale, u_scale = gdp_chunk_fwd(*args)
    if options == "default+w16":
        assert (w.dtype, u.dtype) == (torch.float16, torch.float16)
        assert w_scale.shape == u_scale.shape == w.shape[:3] and w_scale.dtype == torch.float32
    else:
        assert (w.dtype, u.dtype, w_scale.numel(), u_scale.numel()) == (torch.float32, torch.float32, 0, 0)


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K"), [(1, 128), (2, 64), (3, 128), (2, 128)])
def test_gpu_w16_bf16_matches_reference(n_h, K):
    check_gpu_bf16(W16, n_h, K)


@pytest.mark.gpu
def test_gpu_w16_varlen_and_gate_extremes():
    check_gpu_varlen_and_gate_extremes(W16)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1e-6, 1e4])
def test_gpu_w16_far_from_unit_scale(scale):
    check_gpu_far_from_unit_scale(W16, scale)


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K"), [(2, 128), (3, 64)])
def test_gpu_w16_against_fp32_w_and_u(n_h, K):
    """On the GPU W·S is a tf32 product either way, whose W operand keeps fp16's 11 bits: o and the final
    state move by ties and U's fp16 rounding only (far below the bf16 output's own rounding)."""
    inputs = make_inputs(2, 513, 4, K, K, n_h, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0.0))
    d_out = torch.randn(2, 513, 4, K, device="cuda", dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    a = run_with_grads(variant_kernel(NO_W16), inputs, n_h, None, d_out, d_final)
    b = run_with_grads(variant_kernel(W16), inputs, n_h, None, d_out, d_final)
    assert rel(b[0], a[0]) < 2e-3 and rel(b[1], a[1]) < 1e-3
    for name in a[2]:
        assert rel(b[2][name], a[2][name]) < 5e-3, name


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "T", "K", "gated", "gate_range", "dg_floor"), GPU_CONFIGS)
def test_gpu_default_hard_configs(n_h, T, K, gated, gate_range, dg_floor):
    """The default (w16 with lowp_safe since the eleventh session) on the configurations where lowp failed the
    issue's tolerances: no gate at K = 64 (n_h = 2 and 4), gates near 1 at K = 128, and a control."""
    check_bf16_config("default", n_h, T, K, gated, gate_range, dg_floor)
