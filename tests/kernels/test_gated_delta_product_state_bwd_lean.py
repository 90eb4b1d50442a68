"""``sbw16``: the reverse state pass with a short chunk loop and Wᵀ·dδ as one fp16 product on row-scaled W
(``state_bwd_lean.py``).

CPU (interpreter): the lean pass within fp16 rounding of ``state_bwd_kernel`` on row-scaled fp16 W, with odd T
(a partial chunk, walked first), documents (one empty, one shorter than a chunk), ∂L/∂final state or none,
with and without the gate, n_h = 1..4, also far from unit scale; the general kernel wherever the lean one does
not apply; end to end against the fp64 oracle. GPU: bf16 at the issue's tolerances, lowp's failed
configurations, far from unit scale.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product import state
from titan_delta_kernels.gated_delta_product.output import dv_local
from titan_delta_kernels.gated_delta_product.state import split_planes, state_bwd
from titan_delta_kernels.gated_delta_product.wy_series import wy_fwd_series

from .test_gated_delta_product_fast import (
    check_gpu_bf16,
    check_gpu_far_from_unit_scale,
    check_gpu_varlen_and_gate_extremes,
    chunked_inputs,
    variant_kernel,
)
from .test_gated_delta_product_lowp_error import GPU_CONFIGS, check_bf16_config
from .test_gated_delta_product_triton import check_against_reference, make_inputs

LEAN = "default+sflean+sfs16+sbw16"
FP16_TOL = (5e-3, 1e-2, 2e-2)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def reverse_inputs(n_h: int, T: int, K: int, V: int, gated: bool, dtype: torch.dtype, row_scaled: bool,
                   cu: list[int] | None = None):  # fmt: skip
    """What the reverse pass reads: q, k, W (fp32, or row-scaled fp16 with its scales), g, dO, ∂L/∂final
    state and the local ∂L/∂δ, for fresh inputs."""
    B = 1 if cu else 2
    x, geo, seqs = chunked_inputs(B, T, n_h, K, V, cu=cu, dtype=dtype, num_seqs=len(cu) - 1 if cu else None)
    if not gated:
        x["g"] = None
    _, w, _, *scales = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs, row_scaled=row_scaled)
    d_out = torch.randn(B, T, 2, V).to(dtype)
    dvl = dv_local(x["q"], x["k"], x["g"], d_out, 0.25, geo, seqs)
    kw = dict(w_scale=scales[0]) if row_scaled else {}
    return x, geo, seqs, w, d_out, dvl, kw


def both(x, geo, seqs, w, d_out, dvl, kw, d_final: bool = True, wt_mode: int = 0, **lean_kw):
    fin = x["initial_state"] if d_final else None  # any [N, H, K, V] fp32 tensor serves as ∂L/∂final state
    args = (x["q"], x["k"], w, x["g"], d_out, fin, dvl, 0.25, geo, seqs)
    base = state_bwd(*args, wt_mode=wt_mode, **kw)
    return base, state_bwd(*args, wt_mode=wt_mode, **kw, **lean_kw)


CASES = [(1, 70, True, True), (2, 64, False, True), (3, 50, True, False), (4, 33, True, True)]


def check_close(got, base, used: int | None = None, tol: float = 3e-3) -> None:
    for name, a, b in zip(("∂L/∂chunk states", "∂L/∂δ", "∂L/∂S₀"), got, base, strict=True):
        if name == "∂L/∂chunk states" and used is not None:
            a, b = a[:used], b[:used]  # slots past the documents' chunks are never written
        assert rel(a.float(), b.float()) < tol, name


@pytest.mark.parametrize(("n_h", "T", "gated", "d_final"), CASES)
def test_lean_matches_the_general_pass(n_h, T, gated, d_final):
    """Row-scaled fp16 W: the lean pass's one fp16 Wᵀ·dδ against the general pass's bf16x3 (fp16 halves under
    the interpreter), within fp16 rounding; odd T (a partial chunk, walked first), no ∂L/∂final state."""
    inputs = reverse_inputs(n_h, T, 32, 32, gated, torch.float16, True)
    check_close(*reversed(both(*inputs, d_final=d_final, wt_mode=3, lean_w16=True)))


@pytest.mark.parametrize("n_h", [2, 3])
def test_lean_documents(n_h):
    cu = [0, 9, 9, 41, 100]
    x, geo, seqs, w, d_out, dvl, kw = reverse_inputs(n_h, 100, 16, 32, True, torch.float16, True, cu=cu)
    base, got = both(x, geo, seqs, w, d_out, dvl, kw, wt_mode=3, lean_w16=True)
    check_close(got, base, used=int(seqs.chunk_offsets[-1]))


@pytest.mark.parametrize("scale_by", [1.0, 1e-6, 1e4])
def test_w16_within_fp16_rounding(scale_by):
    """One fp16 product with power-of-two scales keeps tf32's 11 bits, also where unscaled fp16 would
    underflow or overflow (the local ∂L/∂δ and ∂L/∂final state scaled, both fp32). Far from 1 only ∂L/∂S₀ is
    compared: the other two are stored in fp16 here, subnormal at 1e-6 and overflowing at 1e4."""
    x, geo, seqs, w, d_out, dvl, kw = reverse_inputs(3, 90, 32, 32, True, torch.float16, True)
    x["initial_state"] = x["initial_state"] * scale_by
    base, got = both(x, geo, seqs, w, d_out, dvl * scale_by, kw, wt_mode=3, lean_w16=True)
    names = ("∂L/∂chunk states", "∂L/∂δ", "∂L/∂S₀")
    for name, a, b in list(zip(names, got, base, strict=True))[0 if scale_by == 1.0 else 2:]:
        assert rel(a.float(), b.float()) < 3e-3, name


def test_lean_runs_only_its_fp16_product(monkeypatch):
    """W as planes, fp32 W, or row-scaled W without ``lean_w16``: the general kernel."""
    launched = []
    real = state.launch
    monkeypatch.setattr(state, "launch", lambda kernel, *a, **k: launched.append(kernel.fn.__name__)
                        or real(kernel, *a, **k))  # fmt: skip
    x, geo, seqs, w, d_out, dvl, _ = reverse_inputs(2, 40, 32, 32, True, torch.float16, False)
    tail = (x["g"], d_out, None, dvl, 0.25, geo, seqs)
    state_bwd(x["q"], x["k"], split_planes(w), *tail, lean_w16=True)
    state_bwd(x["q"], x["k"], w, *tail, lean_w16=True)
    x, geo, seqs, w, d_out, dvl, kw = reverse_inputs(2, 40, 32, 32, True, torch.float16, True)
    tail = (x["g"], d_out, None, dvl, 0.25, geo, seqs)
    state_bwd(x["q"], x["k"], w, *tail, **kw)
    state_bwd(x["q"], x["k"], w, *tail, lean_w16=True, **kw)
    assert launched == ["state_bwd_kernel"] * 3 + ["state_bwd_lean_kernel"]


@pytest.mark.parametrize(("n_h", "T", "gated"), [(1, 70, True), (2, 45, False), (3, 50, True), (4, 33, True)])
def test_lean_matches_reference_fp16(n_h, T, gated):
    inputs = make_inputs(2, T, 2, 32, 16, n_h, dtype=torch.float16, gated=gated)
    check_against_reference(inputs, n_h, None, *FP16_TOL, kernel=variant_kernel(LEAN))


def test_lean_varlen_matches_reference_fp16():
    cu = torch.tensor([0, 9, 9, 40, 47], dtype=torch.int32)
    inputs = make_inputs(1, 47, 2, 32, 16, 3, num_seqs=4, dtype=torch.float16)
    check_against_reference(inputs, 3, cu, *FP16_TOL, kernel=variant_kernel(LEAN))


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K"), [(1, 128), (2, 64), (3, 128), (3, 64)])
def test_gpu_lean_bf16_matches_reference(n_h, K):
    check_gpu_bf16(LEAN, n_h, K)


@pytest.mark.gpu
def test_gpu_lean_varlen_and_gate_extremes():
    check_gpu_varlen_and_gate_extremes(LEAN)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1e-6, 1e4])
def test_gpu_lean_far_from_unit_scale(scale):
    check_gpu_far_from_unit_scale(LEAN, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS)
def test_gpu_lean_hard_configs(config):
    """The configurations where ``lowp`` failed the issue's tolerances (no gate, gates near 1)."""
    check_bf16_config(LEAN, *config)
