"""``sflean`` (the forward state pass with a short chunk loop, ``state_lean.py``) and its product option
``sfs16`` (W·S in fp16, the state scaled per column).

CPU (interpreter): ``sflean`` bitwise equal to ``state_fwd_kernel`` on fp32, fp16 and row-scaled fp16 W, with
odd T (a partial chunk), documents (one empty, one shorter than a chunk), an initial state or none, with and
without the gate, n_h = 1..4 (n_h = 3 has a padding row in its 64-step block); ``sfs16`` within fp16
rounding of it, also far from unit scale; the fallback where the lean kernel does not apply; end to end
against the fp64 oracle. GPU: bf16 at the issue's tolerances, lowp's failed configurations, far from unit
scale, and bitwise equality of ``sflean`` with the default.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product import state
from titan_delta_kernels.gated_delta_product.options import DEFAULT_FLAGS, parse_options
from titan_delta_kernels.gated_delta_product.state import split_planes, state_fwd
from titan_delta_kernels.gated_delta_product.wy_series import wy_fwd_series

from .test_gated_delta_product_fast import (
    check_gpu_bf16,
    check_gpu_far_from_unit_scale,
    check_gpu_varlen_and_gate_extremes,
    chunked_inputs,
    variant_kernel,
)
from .test_gated_delta_product_lowp_error import GPU_CONFIGS, check_bf16_config
from .test_gated_delta_product_triton import check_against_reference, make_inputs, run_with_grads

# The default without the short-loop forward pass (and its fp16 W·S), then with it: the flags under test.
NO_LEAN = "+".join(f for f in DEFAULT_FLAGS if f not in ("sflean", "sfs16"))
LEAN = NO_LEAN + "+sflean"
LEAN_ALL = NO_LEAN + "+sflean+sfs16"
FP16_TOL = (5e-3, 1e-2, 2e-2)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def storage(n_h: int, T: int, K: int, V: int, gated: bool, kind: str, cu: list[int] | None = None):
    """Inputs of the forward pass (fp16 k) with W and U stored as ``kind``: fp32, fp16 or row-scaled fp16."""
    x, geo, seqs = chunked_inputs(1 if cu else 2, T, n_h, K, V, cu=cu, dtype=torch.float16,
                                  num_seqs=len(cu) - 1 if cu else None)  # fmt: skip
    if not gated:
        x["g"] = None
    _, w, u, *scales = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs,
                                     row_scaled=kind == "w16")  # fmt: skip
    if kind == "fp16":
        w, u = w.half(), u.half()
    kw = dict(w_scale=scales[0], u_scale=scales[1]) if kind == "w16" else {}
    return x, geo, seqs, w, u, kw


def both(x, geo, seqs, w, u, kw, h0: bool = True, **lean_kw):
    initial = x["initial_state"] if h0 else None
    base = state_fwd(x["k"], w, u, x["g"], initial, geo, seqs, **kw)
    got = state_fwd(x["k"], w, u, x["g"], initial, geo, seqs, lean=True, **kw, **lean_kw)
    return base, got


LEAN_CASES = [(1, 70, True, True), (2, 64, False, True), (3, 50, True, False), (4, 33, True, True)]


@pytest.mark.parametrize(("n_h", "T", "gated", "h0"), LEAN_CASES)
@pytest.mark.parametrize("kind", ["fp32", "fp16", "w16"])
def test_lean_is_bitwise_the_loop_it_replaces(n_h, T, gated, h0, kind):
    x, geo, seqs, w, u, kw = storage(n_h, T, 32, 32, gated, kind)
    base, got = both(x, geo, seqs, w, u, kw, h0=h0)
    for name, a, b in zip(("chunk states", "δ", "final state"), got, base, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("n_h", [2, 3])
def test_lean_documents_bitwise(n_h):
    """Documents: one empty, one shorter than a chunk, one a whole number of chunks (n_h = 2: 32 tokens)."""
    cu = [0, 9, 9, 41, 100]
    x, geo, seqs, w, u, kw = storage(n_h, 100, 16, 32, True, "w16", cu=cu)
    base, got = both(x, geo, seqs, w, u, kw)
    used = int(seqs.chunk_offsets[-1])  # chunk-state slots past the documents' chunks are never written
    assert torch.equal(got[0][:used], base[0][:used])
    assert torch.equal(got[1], base[1]) and torch.equal(got[2], base[2])


@pytest.fixture(autouse=True)
def s16_at_every_k(monkeypatch):
    """``sfs16`` acts from K = 128 (``state.LEAN_S16_MIN_K``); here at every K (the tests' K are small)."""
    monkeypatch.setattr(state, "LEAN_S16_MIN_K", 16)


@pytest.mark.parametrize("scale_by", [1.0, 1e-6, 1e4])
def test_s16_within_fp16_rounding(scale_by):
    """fp16 operands with power-of-two scales keep tf32's 11 bits, also where unscaled fp16 would underflow
    or overflow (U and the initial state scaled)."""
    x, geo, seqs, w, u, kw = storage(3, 90, 32, 32, True, "w16")
    x["initial_state"] = x["initial_state"] * scale_by
    kw["u_scale"] = kw["u_scale"] * scale_by
    base, got = both(x, geo, seqs, w, u, kw, lean_s16=True)
    assert rel(got[1], base[1]) < 2e-3 and rel(got[2], base[2]) < 2e-3
    if scale_by == 1.0:  # chunk states are stored in fp16 here: at 1e-6 the storage itself is subnormal
        assert rel(got[0].float(), base[0].float()) < 2e-3


def test_lean_falls_back_where_it_does_not_apply(monkeypatch):
    """W as planes, a K that is not a power of two, or V not a multiple of the tile: the general kernel."""
    launched = []
    real = state.launch
    monkeypatch.setattr(state, "launch", lambda kernel, *a, **k: launched.append(kernel.fn.__name__)
                        or real(kernel, *a, **k))  # fmt: skip
    x, geo, seqs, w, u, _ = storage(2, 40, 32, 32, True, "fp32")
    state_fwd(x["k"], split_planes(w), u, x["g"], None, geo, seqs, lean=True)
    x, geo, seqs, w, u, _ = storage(2, 40, 24, 32, True, "fp32")
    state_fwd(x["k"], w, u, x["g"], None, geo, seqs, lean=True)
    x, geo, seqs, w, u, _ = storage(2, 40, 32, 48, True, "fp32")
    state_fwd(x["k"], w, u, x["g"], None, geo, seqs, lean=True)
    state_fwd(x["k"], w, u, x["g"], None, geo, seqs, lean=True, block_v=16)
    assert launched == ["state_fwd_kernel"] * 3 + ["state_fwd_lean_kernel"]


def test_flags_and_stage_keys_parse():
    opts = parse_options(LEAN_ALL)
    assert opts.sflean and opts.sfs16 and opts.w16 and not parse_options(NO_LEAN).sflean
    assert parse_options("default+sfstages=3+sbstages=2").state_fwd_stages == 3
    with pytest.raises(ValueError, match="refused"):
        parse_options("default+sbstages=1")  # the reverse pass's known-bad stage count, through its own key


@pytest.mark.parametrize(("n_h", "T", "gated"), [(1, 70, True), (2, 45, False), (3, 50, True), (4, 33, True)])
@pytest.mark.parametrize("variant", [LEAN, LEAN_ALL])
def test_lean_matches_reference_fp16(n_h, T, gated, variant):
    inputs = make_inputs(2, T, 2, 32, 16, n_h, dtype=torch.float16, gated=gated)
    check_against_reference(inputs, n_h, None, *FP16_TOL, kernel=variant_kernel(variant))


def test_lean_varlen_matches_reference_fp16():
    cu = torch.tensor([0, 9, 9, 40, 47], dtype=torch.int32)
    inputs = make_inputs(1, 47, 2, 32, 16, 2, num_seqs=4, dtype=torch.float16)
    kernel = variant_kernel("plain+wyseries+w16+sflean+sfs16")  # recomputes the states in the backward
    check_against_reference(inputs, 2, cu, *FP16_TOL, kernel=kernel)


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K"), [(1, 128), (2, 64), (3, 128), (3, 64)])
@pytest.mark.parametrize("variant", [LEAN, LEAN_ALL])
def test_gpu_lean_bf16_matches_reference(n_h, K, variant):
    check_gpu_bf16(variant, n_h, K)


@pytest.mark.gpu
def test_gpu_lean_varlen_and_gate_extremes():
    check_gpu_varlen_and_gate_extremes(LEAN_ALL)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1e-6, 1e4])
def test_gpu_lean_far_from_unit_scale(scale):
    check_gpu_far_from_unit_scale(LEAN_ALL, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS)
def test_gpu_lean_hard_configs(config):
    """The configurations where ``lowp`` failed the issue's tolerances (no gate, gates near 1)."""
    check_bf16_config(LEAN_ALL, *config)


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K"), [(3, 128), (2, 64)])
def test_gpu_lean_bitwise_default(n_h, K):
    """The short loop changes addressing and order only: o, the final state and every gradient are bitwise
    those of the general kernel on the GPU too (odd T: a partial chunk)."""
    inputs = make_inputs(2, 517, 4, K, K, n_h, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0.0))
    d_out = torch.randn(2, 517, 4, K, device="cuda", dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    a = run_with_grads(variant_kernel(NO_LEAN), inputs, n_h, None, d_out, d_final)
    b = run_with_grads(variant_kernel(LEAN), inputs, n_h, None, d_out, d_final)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(a[2][n], b[2][n]) for n in a[2])
