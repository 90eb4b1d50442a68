"""DeltaFormer references: chunked vs recurrent, hand-computed semantics, varlen, grads, dispatch, errors."""

from __future__ import annotations

import math

import pytest
import torch

from titan_delta.ops import deltaformer_attn
from titan_delta.ops.deltaformer import api as deltaformer_api
from titan_delta.ops.deltaformer.reference import (
    KERNELS,
    deltaformer_attn_chunked,
    deltaformer_attn_recurrent,
    deltaformer_stage1_chunked,
    deltaformer_stage1_recurrent,
)
from titan_delta.testing import assert_rel_close, rel_rms_error

FP32_TOL = 2e-5  # chunked vs recurrent differ only in summation order


def make_inputs(
    B: int = 2,
    T: int = 11,
    H: int = 2,
    D: int = 8,
    Dv: int = 6,
    dtype: torch.dtype = torch.float32,
    unit_keys: bool = False,
    requires_grad: bool = False,
) -> dict[str, torch.Tensor]:
    """q, k, w ~ N(0,1) (or L2-normalised), v ~ N(0,1), beta ~ U(0,1): realistic, fresh every run."""
    q, k, w = (torch.randn(B, T, H, D, dtype=torch.float64) for _ in range(3))
    if unit_keys:
        q, k, w = (torch.nn.functional.normalize(x, dim=-1) for x in (q, k, w))
    tensors = {
        "q": q,
        "k": k,
        "v": torch.randn(B, T, H, Dv, dtype=torch.float64),
        "w": w,
        "beta": torch.rand(B, T, H, dtype=torch.float64),
    }
    return {n: x.to(dtype).requires_grad_(requires_grad) for n, x in tensors.items()}


def dtype_for(kernel: str) -> torch.dtype:
    """fp64 for "round": in fp32 the two forms' scores can differ by an ulp and flip a rounding."""
    return torch.float64 if kernel == "round" else torch.float32


def run(fn, x: dict[str, torch.Tensor], w_mode: str = "w", **kwargs) -> torch.Tensor:
    """Call a DeltaFormer form with w = x["w"], w = None (= q) or w = k, per ``w_mode``."""
    w = {"w": x["w"], "q": None, "k": x["k"]}[w_mode]
    return fn(x["q"], x["k"], x["v"], x["beta"], w=w, **kwargs)


# ---------------------------------------------------------------- chunked vs recurrent


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("w_mode", ["q", "k"])
@pytest.mark.parametrize(("T", "chunk_size"), [(1, 4), (7, 4), (11, 8), (19, 16), (19, 1), (5, 64)])
def test_chunked_matches_recurrent(kernel: str, w_mode: str, T: int, chunk_size: int) -> None:
    x = make_inputs(T=T, unit_keys=kernel != "softmax", dtype=dtype_for(kernel))
    expected = run(deltaformer_attn_recurrent, x, w_mode, kernel=kernel)
    assert expected.shape == (2, T, 2, 6) and expected.dtype == dtype_for(kernel)
    assert torch.isfinite(expected).all()
    actual = run(deltaformer_attn_chunked, x, w_mode, kernel=kernel, chunk_size=chunk_size)
    assert_rel_close(actual, expected, FP32_TOL, f"o ({kernel}, w={w_mode}, T={T}, C={chunk_size})")
    u_ref = run(deltaformer_stage1_recurrent, x, w_mode, kernel=kernel)
    u = run(deltaformer_stage1_chunked, x, w_mode, kernel=kernel, chunk_size=chunk_size)
    assert_rel_close(u, u_ref, FP32_TOL, f"U ({kernel}, w={w_mode})")


def test_stage1_equals_dense_triangular_solve() -> None:
    """U = (I + diag(β) P)⁻¹ V with P the strictly causal softmax of scale·w·kᵀ, built densely in fp64."""
    x = make_inputs(B=1, T=13, H=1, dtype=torch.float64)
    scores = (x["w"][0, :, 0] @ x["k"][0, :, 0].T) * 8**-0.5
    strictly_causal = torch.ones(13, 13, dtype=torch.bool).tril(-1)
    P = torch.softmax(scores.masked_fill(~strictly_causal, float("-inf")), dim=-1).nan_to_num(0.0)
    A = torch.eye(13, dtype=torch.float64) + x["beta"][0, :, 0, None] * P
    expected = torch.linalg.solve(A, x["v"][0, :, 0])
    for fn, kwargs in ((deltaformer_stage1_recurrent, {}), (deltaformer_stage1_chunked, {"chunk_size": 4})):
        u = run(fn, x, "w", **kwargs)
        assert u.dtype == torch.float64
        assert_rel_close(u[0, :, 0], expected, 1e-12, fn.__name__)


def test_long_sequence_with_unit_beta_and_normalised_keys() -> None:
    """β = 1 softmax stage 1 (off-diagonal row sums = 1) stays finite and chunked == recurrent at T=160."""
    x = make_inputs(B=1, T=160, H=2, D=16, Dv=16, unit_keys=True)
    x["beta"] = torch.ones_like(x["beta"])
    expected = run(deltaformer_stage1_recurrent, x)
    actual = run(deltaformer_stage1_chunked, x, chunk_size=32)
    assert torch.isfinite(expected).all()
    assert_rel_close(actual, expected, 1e-4, "U at T=160, beta=1")


# ---------------------------------------------------------------- semantics pinned by hand


def test_hand_computed_softmax_case() -> None:
    """T=3, one head, D=Dv=1: stage 1 excludes i = t, stage 2 includes it, scale applied before κ1."""
    qv, kv, vv = [0.3, -1.2, 0.7], [1.5, 0.4, -0.9], [2.0, -1.0, 0.5]
    wv, bv = [0.8, -0.6, 1.1], [0.9, 0.5, 0.25]
    s = 0.7

    def sm(logits: list[float]) -> list[float]:
        e = [math.exp(z) for z in logits]
        return [z / sum(e) for z in e]

    u0 = vv[0]
    u1 = vv[1] - bv[1] * u0  # softmax over the single key i=0 is 1, whatever w_1·k_0 is
    p2 = sm([s * wv[2] * kv[0], s * wv[2] * kv[1]])
    u2 = vv[2] - bv[2] * (p2[0] * u0 + p2[1] * u1)
    us = [u0, u1, u2]
    o = [
        sum(p * u for p, u in zip(sm([s * qv[t] * kv[i] for i in range(t + 1)]), us[: t + 1], strict=True))
        for t in range(3)
    ]
    assert o[0] == u0  # o_0 attends only to itself

    def t3(vals: list[float]) -> torch.Tensor:
        return torch.tensor(vals, dtype=torch.float64).view(1, 3, 1, 1)

    args = (t3(qv), t3(kv), t3(vv), t3(bv).view(1, 3, 1))
    for fn in (deltaformer_attn_recurrent, deltaformer_attn_chunked, deltaformer_attn):
        out = fn(*args, w=t3(wv), scale=s)
        torch.testing.assert_close(out.view(3), torch.tensor(o, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    for fn in (deltaformer_stage1_recurrent, deltaformer_stage1_chunked):
        u = fn(*args, w=t3(wv), scale=s)
        torch.testing.assert_close(u.view(3), torch.tensor(us, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("kernel", "kappa"),
    [
        ("linear", lambda z: z),
        ("relu", lambda z: max(z, 0.0)),
        ("round", lambda z: round(z, 2)),
        ("exp", math.exp),
    ],
)
def test_hand_computed_elementwise_kernels(kernel: str, kappa) -> None:
    """u_2 = v_2 − β_2 (κ(s·w_2k_0) u_0 + κ(s·w_2k_1) u_1), with κ of the *scaled* score, unnormalised."""
    kv, vv, wv, bv, s = [1.5, 0.4, -0.9], [2.0, -1.0, 0.5], [0.8, -0.6, 1.2], [0.9, 0.5, 0.25], 0.7
    u0 = vv[0]
    u1 = vv[1] - bv[1] * kappa(s * wv[1] * kv[0]) * u0
    u2 = vv[2] - bv[2] * (kappa(s * wv[2] * kv[0]) * u0 + kappa(s * wv[2] * kv[1]) * u1)

    def t3(vals: list[float]) -> torch.Tensor:
        return torch.tensor(vals, dtype=torch.float64).view(1, 3, 1, 1)

    for fn in (deltaformer_stage1_recurrent, deltaformer_stage1_chunked):
        u = fn(t3(wv), t3(kv), t3(vv), t3(bv).view(1, 3, 1), w=t3(wv), kernel=kernel, scale=s)
        torch.testing.assert_close(u.view(3), torch.tensor([u0, u1, u2], dtype=torch.float64))


def test_beta_none_equals_ones() -> None:
    x = make_inputs(T=9)
    ones = torch.ones_like(x["beta"])
    for fn in (deltaformer_attn_recurrent, deltaformer_attn_chunked, deltaformer_attn):
        with_none = fn(x["q"], x["k"], x["v"], None)
        with_ones = fn(x["q"], x["k"], x["v"], ones)
        torch.testing.assert_close(with_none, with_ones, rtol=0, atol=0)


def test_default_w_is_q_and_default_scale() -> None:
    x = make_inputs(T=9, D=16)
    implicit = deltaformer_attn_chunked(x["q"], x["k"], x["v"], x["beta"], chunk_size=4)
    explicit = deltaformer_attn_chunked(x["q"], x["k"], x["v"], x["beta"], w=x["q"], scale=0.25, chunk_size=4)
    torch.testing.assert_close(implicit, explicit, rtol=0, atol=0)


def test_empty_sequence() -> None:
    x = make_inputs(T=0)
    for fn in (deltaformer_attn_recurrent, deltaformer_attn_chunked, deltaformer_stage1_chunked):
        assert run(fn, x).shape == (2, 0, 2, 6)


def test_non_contiguous_inputs() -> None:
    x = make_inputs(T=10)
    transposed = {n: t.transpose(0, 1).contiguous().transpose(0, 1) for n, t in x.items()}
    assert not transposed["q"].is_contiguous()
    torch.testing.assert_close(
        run(deltaformer_attn_chunked, transposed, chunk_size=4),
        run(deltaformer_attn_chunked, x, chunk_size=4),
        rtol=0,
        atol=0,
    )


# ---------------------------------------------------------------- varlen


@pytest.mark.parametrize("kernel", KERNELS)
def test_varlen_equals_separate_documents(kernel: str) -> None:
    """Documents of lengths 5, 0, 1, 9, 6 packed along T: each output equals running it alone."""
    lengths = [5, 0, 1, 9, 6]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    x = make_inputs(B=1, T=sum(lengths), unit_keys=kernel != "softmax", dtype=dtype_for(kernel))
    packed_rec = run(deltaformer_attn_recurrent, x, kernel=kernel, cu_seqlens=cu_seqlens)
    packed_chunk = run(deltaformer_attn_chunked, x, kernel=kernel, cu_seqlens=cu_seqlens.long(), chunk_size=4)
    packed_u = run(deltaformer_stage1_chunked, x, kernel=kernel, cu_seqlens=cu_seqlens, chunk_size=4)
    for lo, hi in zip(cu_seqlens.tolist(), cu_seqlens.tolist()[1:], strict=False):
        doc = {n: t[:, lo:hi] for n, t in x.items()}
        alone = run(deltaformer_attn_recurrent, doc, kernel=kernel)
        assert_rel_close(packed_rec[:, lo:hi], alone, 1e-6, f"recurrent doc {lo}:{hi}")
        assert_rel_close(packed_chunk[:, lo:hi], alone, FP32_TOL, f"chunked doc {lo}:{hi}")
        alone_u = run(deltaformer_stage1_recurrent, doc, kernel=kernel)
        assert_rel_close(packed_u[:, lo:hi], alone_u, FP32_TOL, f"chunked U doc {lo}:{hi}")


# ---------------------------------------------------------------- low precision


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_match_fp32(dtype: torch.dtype) -> None:
    x32 = make_inputs(T=37, D=16, Dv=16, unit_keys=True)
    x16 = {n: t.to(dtype) for n, t in x32.items()}
    expected = run(deltaformer_attn_recurrent, x32)
    for fn, kwargs in ((deltaformer_attn_chunked, {"chunk_size": 16}), (deltaformer_attn, {})):
        out = run(fn, x16, **kwargs)
        assert out.dtype == dtype and out.shape == expected.shape
        err = rel_rms_error(out, expected)
        assert err <= 1e-2, f"{dtype} {fn.__name__}: rel RMS error {err:.3e}"


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k != "round"])  # round is piecewise constant
@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_gradcheck_fp64(kernel: str, form: str) -> None:
    x = make_inputs(B=1, T=5, H=2, D=3, Dv=2, dtype=torch.float64, requires_grad=True)
    fn = deltaformer_attn_recurrent if form == "recurrent" else deltaformer_attn_chunked
    kwargs = {"kernel": kernel} if form == "recurrent" else {"kernel": kernel, "chunk_size": 2}
    inputs = (x["q"], x["k"], x["v"], x["beta"], x["w"])
    # fast_mode compares the analytic and numerical Jacobians along random directions: same check, ~10x faster
    assert torch.autograd.gradcheck(
        lambda q, k, v, b, w: fn(q, k, v, b, w=w, **kwargs), inputs, fast_mode=True
    )


def test_gradcheck_fp64_varlen_softmax() -> None:
    """Gradients stay exact across document starts, where the strictly-causal softmax row is empty."""
    x = make_inputs(B=1, T=6, H=1, D=3, Dv=2, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor([0, 1, 4, 6])
    for fn, kwargs in ((deltaformer_attn_recurrent, {}), (deltaformer_attn_chunked, {"chunk_size": 4})):
        assert torch.autograd.gradcheck(
            lambda q, k, v, b, fn=fn, kwargs=kwargs: fn(q, k, v, b, cu_seqlens=cu, **kwargs),
            (x["q"], x["k"], x["v"], x["beta"]),
            fast_mode=fn is deltaformer_attn_recurrent,  # the torch backend gets the full Jacobian check
        )


@pytest.mark.parametrize("kernel", KERNELS)
def test_recurrent_and_chunked_gradients_match(kernel: str) -> None:
    cu = torch.tensor([0, 1, 12, 21])
    seed = int(torch.randint(0, 2**31 - 1, ()))
    grads = []
    for fn, kwargs in ((deltaformer_attn_recurrent, {}), (deltaformer_attn_chunked, {"chunk_size": 8})):
        torch.manual_seed(seed)  # the same fresh inputs for both forms
        x = make_inputs(B=1, T=21, unit_keys=kernel != "softmax", dtype=dtype_for(kernel), requires_grad=True)
        out = run(fn, x, kernel=kernel, cu_seqlens=cu, **kwargs)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        grads_of = {}
        for name, t in x.items():
            assert t.grad is not None and torch.isfinite(t.grad).all(), f"{fn.__name__} d{name} not finite"
            grads_of[name] = t.grad
        grads.append(grads_of)
    for name in grads[0]:
        assert_rel_close(grads[1][name], grads[0][name], 1e-4, f"d{name} ({kernel})")


def test_round_kernel_gives_no_gradient_through_kappa() -> None:
    """With κ1 = round, w enters only through the rounding, so its gradient is exactly zero."""
    x = make_inputs(T=7, requires_grad=True)
    run(deltaformer_attn_chunked, x, kernel="round", chunk_size=4).sum().backward()
    assert torch.count_nonzero(x["w"].grad) == 0
    assert torch.count_nonzero(x["q"].grad) > 0


# ---------------------------------------------------------------- backend dispatch


def test_backend_torch_and_auto_on_cpu_run_the_reference() -> None:
    x = make_inputs(T=70)
    expected = run(deltaformer_attn_chunked, x)
    for backend in ("torch", "auto"):
        torch.testing.assert_close(run(deltaformer_attn, x, backend=backend), expected, rtol=0, atol=0)
    assert_rel_close(
        run(deltaformer_attn, x, kernel="relu", backend="torch"),
        run(deltaformer_attn_recurrent, x, kernel="relu"),
        FP32_TOL,
        "relu via api",
    )


def test_dispatch_when_the_kernel_would_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on CUDA: "auto" takes the kernel, falls back when it is missing; "torch" never touches it."""
    x = make_inputs(T=6)
    expected = run(deltaformer_attn_chunked, x)
    monkeypatch.setattr(deltaformer_api, "_auto_prefers_triton", lambda *args: True)
    monkeypatch.setattr(deltaformer_api, "_import_triton_kernel", lambda: lambda q, k, v, beta, **kw: -v)
    torch.testing.assert_close(run(deltaformer_attn, x, backend="auto"), -x["v"], rtol=0, atol=0)
    torch.testing.assert_close(run(deltaformer_attn, x, backend="torch"), expected, rtol=0, atol=0)

    def missing():
        raise ImportError("no module named titan_delta_kernels.deltaformer")

    monkeypatch.setattr(deltaformer_api, "_import_triton_kernel", missing)
    torch.testing.assert_close(run(deltaformer_attn, x, backend="auto"), expected, rtol=0, atol=0)


def test_backend_triton_passes_the_kernel_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_kernel(q, k, v, beta, *, w=None, scale, cu_seqlens=None):
        calls.append({"beta": beta, "w": w, "scale": scale, "cu_seqlens": cu_seqlens})
        return torch.zeros_like(v)

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(deltaformer_api, "_import_triton_kernel", lambda: fake_kernel)
    x = make_inputs(B=1, T=5, D=16)
    cu = torch.tensor([0, 2, 5])
    deltaformer_attn(x["q"], x["k"], x["v"], cu_seqlens=cu, backend="triton")
    (call,) = calls
    assert torch.equal(call["beta"], torch.ones(1, 5, 2)) and call["w"] is None
    assert call["scale"] == 0.25 and isinstance(call["scale"], float) and call["cu_seqlens"] is cu


def test_backend_triton_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    x = make_inputs(T=5)
    with pytest.raises(ValueError, match="backend='triton' supports kernel"):
        run(deltaformer_attn, x, kernel="relu", backend="triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        run(deltaformer_attn, x, backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def missing():
        raise ImportError("no module named titan_delta_kernels.deltaformer")

    monkeypatch.setattr(deltaformer_api, "_import_triton_kernel", missing)
    with pytest.raises(RuntimeError, match="not importable"):
        run(deltaformer_attn, x, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        run(deltaformer_attn, x, backend="cuda")


def test_auto_head_dims_are_the_kernels() -> None:
    """"auto" sends to the kernel exactly the head dims it takes (16..128) and the rest to the reference."""
    from titan_delta_kernels.deltaformer.config import MAX_HEAD_DIM

    assert deltaformer_api.TRITON_HEAD_DIMS == (16, MAX_HEAD_DIM)


@pytest.mark.gpu
@pytest.mark.parametrize(("D", "Dv"), [(256, 64), (64, 160)])
def test_auto_on_cuda_falls_back_above_the_kernels_head_dims(D: int, Dv: int) -> None:
    x = {n: t.cuda() for n, t in make_inputs(B=1, T=100, H=2, D=D, Dv=Dv, unit_keys=True).items()}
    torch.testing.assert_close(
        run(deltaformer_attn, x, backend="auto"), run(deltaformer_attn_chunked, x), rtol=0, atol=0
    )


@pytest.mark.gpu
def test_auto_on_cuda_matches_reference() -> None:
    x = {n: t.cuda() for n, t in make_inputs(B=2, T=300, H=2, D=64, Dv=64, unit_keys=True).items()}
    expected = run(deltaformer_attn_chunked, x)
    assert_rel_close(run(deltaformer_attn, x, backend="auto"), expected, 1e-3, "auto on CUDA")
    x64 = {n: t.double() for n, t in x.items()}  # fp64 stays on the reference under "auto"
    torch.testing.assert_close(
        run(deltaformer_attn, x64, backend="auto"), run(deltaformer_attn_chunked, x64), rtol=0, atol=0
    )


# ---------------------------------------------------------------- bad input


def _bad(**overrides):
    x = make_inputs(B=1, T=6)
    x.update(overrides)
    return x


@pytest.mark.parametrize("fn", [deltaformer_attn, deltaformer_attn_recurrent, deltaformer_attn_chunked])
@pytest.mark.parametrize(
    ("x_kwargs", "error", "match"),
    [
        (lambda: (_bad(q=torch.randn(6, 2, 8)), {}), ValueError, r"q must have shape \[B,T,H,D\]"),
        (lambda: (_bad(k=torch.randn(1, 7, 2, 8)), {}), ValueError, "k must have shape"),
        (lambda: (_bad(v=torch.randn(1, 6, 3, 6)), {}), ValueError, "v must have shape"),
        (lambda: (_bad(w=torch.randn(1, 6, 2, 4)), {}), ValueError, "w must have shape"),
        (lambda: (_bad(beta=torch.rand(1, 6, 2, 1)), {}), ValueError, "beta must have shape"),
        (lambda: (_bad(beta=torch.rand(1, 5, 2)), {}), ValueError, "beta must have shape"),
        (lambda: (_bad(q=torch.ones(1, 6, 2, 8, dtype=torch.int64)), {}), TypeError, "q must have dtype"),
        (lambda: (_bad(k=torch.randn(1, 6, 2, 8, dtype=torch.float64)), {}), TypeError, "same dtype as q"),
        (lambda: (_bad(), {"kernel": "sigmoid"}), ValueError, "kernel must be one of"),
        (lambda: (_bad(), {"scale": float("nan")}), ValueError, "scale must be a finite float"),
        (lambda: (_bad(), {"cu_seqlens": torch.tensor([0.0, 6.0])}), TypeError, "int32/int64"),
        (lambda: (_bad(), {"cu_seqlens": torch.tensor([1, 6])}), ValueError, "start at 0"),
        (lambda: (_bad(), {"cu_seqlens": torch.tensor([0, 5])}), ValueError, "end at T=6"),
        (lambda: (_bad(), {"cu_seqlens": torch.tensor([0, 4, 2, 6])}), ValueError, "non-decreasing"),
        (lambda: (make_inputs(B=2, T=6), {"cu_seqlens": torch.tensor([0, 6])}), ValueError, "B=2"),
        (lambda: (_bad(k=torch.randn(1, 6, 2, 8, device="meta")), {}), ValueError, "one device"),
        (lambda: (_bad(), {"cu_seqlens": torch.tensor([0, 6], device="meta")}), ValueError, "one device"),
    ],
)
def test_bad_inputs_raise_clear_errors(fn, x_kwargs, error, match) -> None:
    x, kwargs = x_kwargs()
    with pytest.raises(error, match=match):
        run(fn, x, **kwargs)


@pytest.mark.parametrize("chunk_size", [0, -4, 2.5, True])
def test_bad_chunk_size(chunk_size) -> None:
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        run(deltaformer_attn_chunked, make_inputs(T=4), chunk_size=chunk_size)
