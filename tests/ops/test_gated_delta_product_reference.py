"""Gated DeltaProduct references: the chunked (UT/WY) form against the token-by-token oracle; semantics."""

from __future__ import annotations

import math

import pytest
import torch

from titan_delta.ops import gated_delta_product
from titan_delta.ops.gated_delta_product import api
from titan_delta.ops.gated_delta_product.reference import (
    gated_delta_product_chunked,
    gated_delta_product_recurrent,
    gated_delta_product_step,
)
from titan_delta.testing import assert_rel_close, rel_rms_error

from .gdp_helpers import initial_state_for, make_inputs, split_tokens

FP64_TOL = 1e-12


@pytest.mark.parametrize("n_h", [1, 2, 3, 4])
@pytest.mark.parametrize("gated", [True, False])
def test_chunked_matches_recurrent(n_h: int, gated: bool) -> None:
    x = make_inputs(T=11, n_h=n_h, gated=gated)
    h0 = initial_state_for(x)
    o_ref, s_ref = gated_delta_product_recurrent(
        **x, num_householder=n_h, initial_state=h0, output_final_state=True
    )
    for chunk_size in (1, 3, 8, 64):  # 11·n_h is never a multiple of 3, 8 or 64
        o, s = gated_delta_product_chunked(
            **x, num_householder=n_h, initial_state=h0, output_final_state=True, chunk_size=chunk_size
        )
        assert o.dtype == torch.float64 and s.dtype == torch.float64
        assert_rel_close(o, o_ref, FP64_TOL, f"o (chunk {chunk_size})")
        assert_rel_close(s, s_ref, FP64_TOL, f"final state (chunk {chunk_size})")


def test_public_op_dispatches_to_reference_on_cpu() -> None:
    x = make_inputs(n_h=3)
    h0 = initial_state_for(x)
    h0_copy = h0.clone()
    o_ref, s_ref = gated_delta_product_recurrent(
        **x, num_householder=3, initial_state=h0, output_final_state=True
    )
    for backend in ("auto", "torch"):
        o, s = gated_delta_product(
            **x, num_householder=3, initial_state=h0, output_final_state=True, backend=backend
        )
        assert_rel_close(o, o_ref, FP64_TOL, f"o ({backend})")
        assert_rel_close(s, s_ref, FP64_TOL, f"state ({backend})")
    o, s = gated_delta_product(**x, num_householder=3)
    assert s is None and o.shape == (2, 11, 2, 6)
    assert torch.equal(h0, h0_copy), "initial_state must not be modified in place"


def test_hand_computed_case() -> None:
    """K=2, V=1, scale=1, T=2, n_h=2, worked by hand: pins gate-first, step order and read-after-last-step."""
    q = torch.tensor([[1.0, 1.0], [2.0, -1.0]], dtype=torch.float64).reshape(1, 2, 1, 2)
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]], dtype=torch.float64).reshape(
        1, 4, 1, 2
    )
    v = torch.tensor([3.0, 4.0, 0.0, 1.0], dtype=torch.float64).reshape(1, 4, 1, 1)
    beta = torch.tensor([0.5, 1.5, 0.25, 1.0], dtype=torch.float64).reshape(1, 4, 1)
    g = torch.tensor([math.log(0.5), 0.0], dtype=torch.float64).reshape(1, 2, 1)
    h0 = torch.tensor([2.0, 0.0], dtype=torch.float64).reshape(1, 1, 2, 1)
    # token 0: S=[1,0] (gate 0.5); step k=e0: S=[2,0]; step k=e1: S=[2,6]; o = [1,1]·S = 8
    # token 1: step k=[1,1], β=¼, pred 8: S=[0,4]; step k=e0, v=1: S=[1,4]; o = [2,-1]·S = -2
    expected_o = torch.tensor([8.0, -2.0], dtype=torch.float64).reshape(1, 2, 1, 1)
    expected_s = torch.tensor([1.0, 4.0], dtype=torch.float64).reshape(1, 1, 2, 1)
    for fn, extra in ((gated_delta_product_recurrent, {}), (gated_delta_product_chunked, {"chunk_size": 3})):
        o, s = fn(
            q, k, v, g, beta, num_householder=2, scale=1.0, initial_state=h0, output_final_state=True, **extra
        )
        torch.testing.assert_close(o, expected_o, rtol=0, atol=1e-14)
        torch.testing.assert_close(s, expected_s, rtol=0, atol=1e-14)


def test_single_householder_is_plain_gated_delta_rule() -> None:
    """n_h = 1 against S_t = (I − β_t k_t k_tᵀ) e^{g_t} S_{t−1} + β_t k_t v_tᵀ with explicit matrices."""
    x = make_inputs(B=1, T=9, H=1, K=5, V=3, n_h=1)
    q, k, v, g, beta = (x[name][0, :, 0] for name in ("q", "k", "v", "g", "beta"))
    S = torch.zeros(5, 3, dtype=torch.float64)
    outputs = []
    for t in range(9):
        householder = torch.eye(5, dtype=torch.float64) - beta[t] * torch.outer(k[t], k[t])
        S = householder @ (g[t].exp() * S) + beta[t] * torch.outer(k[t], v[t])
        outputs.append(S.T @ (q[t] * 5**-0.5))
    expected = torch.stack(outputs).reshape(1, 9, 1, 3)
    for fn in (gated_delta_product_recurrent, gated_delta_product_chunked):
        o, s = fn(**x, num_householder=1, output_final_state=True)
        assert_rel_close(o, expected, FP64_TOL, fn.__name__)
        assert_rel_close(s[0, 0], S, FP64_TOL, fn.__name__)


def test_gate_extremes_stay_finite() -> None:
    """g = −30 wipes the state at every token; g = 0 is no gate at all. Both finite, in fp32 and grads."""
    n_h = 2
    x = make_inputs(T=40, n_h=n_h, dtype=torch.float32, log_gate=-30.0)
    o, _ = gated_delta_product_chunked(**x, num_householder=n_h, chunk_size=64)
    assert torch.isfinite(o).all()
    # With the state wiped each token, token t sees only its own n_h steps.
    alone = [
        gated_delta_product_recurrent(
            x["q"][:, t : t + 1],
            x["k"][:, t * n_h : (t + 1) * n_h],
            x["v"][:, t * n_h : (t + 1) * n_h],
            None,
            x["beta"][:, t * n_h : (t + 1) * n_h],
            num_householder=n_h,
        )[0]
        for t in range(40)
    ]
    assert_rel_close(o, torch.cat(alone, dim=1), 1e-5, "g=-30 vs isolated tokens")

    x["g"] = torch.zeros_like(x["g"])
    o_open, _ = gated_delta_product_chunked(**x, num_householder=n_h, chunk_size=64)
    o_ungated, _ = gated_delta_product_recurrent(**{**x, "g": None}, num_householder=n_h)
    assert_rel_close(o_open, o_ungated, 1e-5, "g=0 vs no gate")

    for log_gate in (-30.0, -1e-7):
        x = make_inputs(T=40, n_h=n_h, dtype=torch.float32, log_gate=log_gate)
        leaves = {name: t.requires_grad_() for name, t in x.items() if t is not None}
        o, s = gated_delta_product_chunked(**x, num_householder=n_h, output_final_state=True, chunk_size=64)
        (o.square().sum() + s.square().sum()).backward()
        for name, t in leaves.items():
            assert torch.isfinite(t.grad).all(), f"grad of {name} not finite at g={log_gate}"


@pytest.mark.parametrize("log_gate", [-30.0, -1e-7])
def test_extreme_gates_chunked_matches_recurrent(log_gate: float) -> None:
    """Cumulative log gates reach −30·32 inside one chunk; only exponent differences keep that exact."""
    x = make_inputs(T=37, n_h=2, log_gate=log_gate)
    h0 = initial_state_for(x)
    o_ref, s_ref = gated_delta_product_recurrent(
        **x, num_householder=2, initial_state=h0, output_final_state=True
    )
    o, s = gated_delta_product_chunked(
        **x, num_householder=2, initial_state=h0, output_final_state=True, chunk_size=64
    )
    assert_rel_close(o, o_ref, FP64_TOL, "o")
    assert_rel_close(s, s_ref, FP64_TOL, "final state")


def test_state_carries_across_calls() -> None:
    """Running two halves with the first's final state as the second's initial state equals one call."""
    x = make_inputs(T=13, n_h=3)
    o_full, s_full = gated_delta_product_chunked(
        **x, num_householder=3, output_final_state=True, chunk_size=8
    )
    first, second = split_tokens(x, cut=6, n_h=3)
    o1, s1 = gated_delta_product_chunked(**first, num_householder=3, output_final_state=True, chunk_size=8)
    o2, s2 = gated_delta_product_recurrent(
        **second, num_householder=3, initial_state=s1, output_final_state=True
    )
    assert_rel_close(torch.cat([o1, o2], dim=1), o_full, FP64_TOL, "o")
    assert_rel_close(s2, s_full, FP64_TOL, "final state")


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_varlen_equals_separate_sequences(index_dtype: torch.dtype) -> None:
    n_h, lengths = 3, [5, 0, 1, 9, 4]
    T = sum(lengths)
    x = make_inputs(B=1, T=T, n_h=n_h)
    h0 = initial_state_for(x, N=len(lengths))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=index_dtype)
    outputs, finals = [], []
    for i, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        step_slice, token_slice = slice(start * n_h, end * n_h), slice(start, end)
        part = {n: t[:, step_slice if n in ("k", "v", "beta") else token_slice] for n, t in x.items()}
        o_i, s_i = gated_delta_product_recurrent(
            **part, num_householder=n_h, initial_state=h0[i : i + 1], output_final_state=True
        )
        outputs.append(o_i)
        finals.append(s_i)
    expected_o, expected_s = torch.cat(outputs, dim=1), torch.cat(finals)
    assert torch.equal(expected_s[1], h0[1]), "an empty document keeps its initial state"
    runs = {
        "recurrent": lambda **kw: gated_delta_product_recurrent(**kw),
        "chunked": lambda **kw: gated_delta_product_chunked(**kw, chunk_size=4),
        "public": lambda **kw: gated_delta_product(**kw, backend="torch"),
    }
    for name, run in runs.items():
        o, s = run(**x, num_householder=n_h, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        assert_rel_close(o, expected_o, FP64_TOL, f"{name} o")
        assert_rel_close(s, expected_s, FP64_TOL, f"{name} final state")


def test_step_helper_reproduces_recurrent() -> None:
    n_h, T = 3, 7
    x = make_inputs(T=T, n_h=n_h, dtype=torch.float32)
    h0 = initial_state_for(x, dtype=torch.float32)
    o_ref, s_ref = gated_delta_product_recurrent(
        **x, num_householder=n_h, initial_state=h0, output_final_state=True
    )
    B = x["q"].shape[0]
    split = {n: x[n].reshape(B, T, n_h, *x[n].shape[2:]) for n in ("k", "v", "beta")}
    state, outputs = h0, []
    for t in range(T):
        o_t, state = gated_delta_product_step(
            x["q"][:, t],
            split["k"][:, t],
            split["v"][:, t],
            x["g"][:, t],
            split["beta"][:, t],
            state,
            scale=None,
        )
        outputs.append(o_t)
    assert state.dtype == torch.float32
    assert_rel_close(torch.stack(outputs, dim=1), o_ref, 1e-6, "o")
    assert_rel_close(state, s_ref, 1e-6, "state")


def test_bf16_inputs_compute_in_fp32() -> None:
    x = make_inputs(T=21, n_h=2, dtype=torch.float32)
    x16 = {n: t.to(torch.bfloat16) for n, t in x.items()}
    o16, s16 = gated_delta_product_chunked(**x16, num_householder=2, output_final_state=True, chunk_size=16)
    assert o16.dtype == torch.bfloat16 and s16.dtype == torch.float32
    # Same bf16-rounded values in fp32: only the final rounding of o to bf16 differs.
    o_up, s_up = gated_delta_product_recurrent(
        **{n: t.float() for n, t in x16.items()}, num_householder=2, output_final_state=True
    )
    assert rel_rms_error(s16, s_up) < 1e-5
    assert rel_rms_error(o16, o_up) < 8e-3
    # Against the unrounded fp32 inputs: bf16 input rounding (2^-8 relative) dominates.
    o32, _ = gated_delta_product_recurrent(**x, num_householder=2)
    assert rel_rms_error(o16, o32) < 5e-2


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_gradcheck_fp64(form: str) -> None:
    x = make_inputs(B=2, T=3, H=1, K=3, V=2, n_h=2)
    h0 = initial_state_for(x)
    names = ("q", "k", "v", "g", "beta")
    inputs = tuple(t.requires_grad_() for t in (*(x[n] for n in names), h0))

    def fn(q, k, v, g, beta, h0):
        if form == "recurrent":
            return gated_delta_product_recurrent(
                q, k, v, g, beta, num_householder=2, initial_state=h0, output_final_state=True
            )
        return gated_delta_product_chunked(
            q, k, v, g, beta, num_householder=2, initial_state=h0, output_final_state=True, chunk_size=4
        )

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


def test_recurrent_and_chunked_gradients_agree() -> None:
    n_h = 3
    x = make_inputs(T=10, n_h=n_h)
    x["h0"] = initial_state_for(x)
    grads = {}
    for form in ("recurrent", "chunked"):
        leaves = {n: t.detach().clone().requires_grad_() for n, t in x.items()}
        h0 = leaves.pop("h0")
        if form == "recurrent":
            o, s = gated_delta_product_recurrent(
                **leaves, num_householder=n_h, initial_state=h0, output_final_state=True
            )
        else:
            o, s = gated_delta_product_chunked(
                **leaves, num_householder=n_h, initial_state=h0, output_final_state=True, chunk_size=7
            )
        gen = torch.Generator().manual_seed(1234)  # same upstream gradients for both forms
        do = torch.randn(o.shape, generator=gen, dtype=o.dtype)
        ds = torch.randn(s.shape, generator=gen, dtype=s.dtype)
        torch.autograd.backward((o, s), (do, ds))
        grads[form] = {n: t.grad for n, t in {**leaves, "h0": h0}.items()}
    for name, expected in grads["recurrent"].items():
        assert_rel_close(grads["chunked"][name], expected, 1e-11, f"d{name}")


# ---------------------------------------------------------------- bad input


def _call(**overrides):
    x = make_inputs(B=2, T=4, H=2, K=4, V=3, n_h=2, dtype=torch.float32)
    kwargs = {"num_householder": 2, **x, **overrides}
    return gated_delta_product(**kwargs)


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"num_householder": 0}, ValueError, "num_householder must be an int >= 1"),
        ({"num_householder": 2.0}, ValueError, "num_householder must be an int >= 1"),
        ({"num_householder": True}, ValueError, "num_householder must be an int >= 1"),
        ({"num_householder": 3}, ValueError, r"k must have T\*num_householder = 4\*3 = 12"),
        ({"q": torch.randn(2, 4, 8)}, ValueError, r"q must have shape \[B, T, H, K\]"),
        ({"k": torch.randn(2, 8, 2, 5)}, ValueError, "k must have shape"),
        ({"v": torch.randn(2, 7, 2, 3)}, ValueError, "v must have shape"),
        ({"beta": torch.rand(2, 4, 2)}, ValueError, "beta must have shape"),
        ({"g": torch.zeros(2, 8, 2)}, ValueError, r"g must have shape \[B, T, H\]"),
        ({"k": torch.randn(2, 8, 2, 4, dtype=torch.float64)}, TypeError, "q, k and v must share one dtype"),
        ({"beta": torch.ones(2, 8, 2, dtype=torch.int64)}, TypeError, "beta must have dtype in"),
        ({"q": [[1.0]]}, TypeError, "q must be a torch.Tensor"),
        ({"initial_state": torch.zeros(2, 2, 4, 4)}, ValueError, r"initial_state must have shape \[N, H, K"),
        ({"initial_state": torch.zeros(2, 2, 4, 3).bfloat16()}, TypeError, "initial_state must have dtype"),
        ({"cu_seqlens": torch.tensor([0, 4], dtype=torch.int32)}, ValueError, "batch size must be 1"),
        ({"scale": float("nan")}, ValueError, "scale must be a finite float"),
        ({"backend": "cuda"}, ValueError, "backend must be one of"),
        ({"g": torch.zeros(2, 4, 2, device="meta")}, ValueError, "all inputs must be on one device"),
    ],
)
def test_bad_input_errors(overrides: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        _call(**overrides)


def test_bad_cu_seqlens_errors() -> None:
    x = make_inputs(B=1, T=6, H=1, K=4, V=3, n_h=2, dtype=torch.float32)
    with pytest.raises(TypeError, match="cu_seqlens must be a 1-D int32/int64"):
        gated_delta_product(**x, num_householder=2, cu_seqlens=torch.tensor([0.0, 6.0]))
    with pytest.raises(ValueError, match="end at T=6"):
        gated_delta_product(**x, num_householder=2, cu_seqlens=torch.tensor([0, 3, 5]))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[N, H, K, V\] = \(2, 1, 4, 3\)"):
        gated_delta_product(
            **x, num_householder=2, cu_seqlens=torch.tensor([0, 3, 6]), initial_state=torch.zeros(1, 1, 4, 3)
        )


def test_reference_specific_errors() -> None:
    x = make_inputs(B=1, T=3, H=1, K=4, V=3, n_h=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
        gated_delta_product_chunked(**x, num_householder=2, chunk_size=0)
    with pytest.raises(ValueError, match="k must have T"):
        gated_delta_product_recurrent(**x, num_householder=4)
    state = torch.zeros(1, 1, 4, 3)
    q_t, k_t, v_t = torch.randn(1, 1, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 3)
    beta_t, g_t = torch.rand(1, 2, 1), torch.zeros(1, 1)
    with pytest.raises(ValueError, match=r"beta_t must have shape \[N, num_householder, H\]"):
        gated_delta_product_step(q_t, k_t, v_t, g_t, torch.rand(1, 3, 1), state)
    with pytest.raises(ValueError, match=r"state must have shape \[N, H, K, V\]"):
        gated_delta_product_step(q_t, k_t, v_t, g_t, beta_t, torch.zeros(1, 1, 3, 4))
    with pytest.raises(TypeError, match="state must have dtype in"):
        gated_delta_product_step(q_t, k_t, v_t, g_t, beta_t, state.half())
    with pytest.raises(ValueError, match=r"g_t must have shape \[N, H\]"):
        gated_delta_product_step(q_t, k_t, v_t, torch.zeros(1, 2), beta_t, state)


def test_backend_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "triton" calls the kernel with the agreed keywords (or fails clearly); "auto" on CPU never does."""
    calls = []

    def fake_kernel(q, k, v, g, beta, **kwargs):
        calls.append(kwargs)
        return torch.zeros_like(q[..., :1]), None

    monkeypatch.setattr(api, "_load_triton_kernel", lambda: fake_kernel)
    x = make_inputs(B=1, T=3, H=1, K=4, V=3, n_h=2, dtype=torch.float32)
    gated_delta_product(**x, num_householder=2, backend="auto")
    assert calls == []
    gated_delta_product(**x, num_householder=2, backend="triton")
    agreed = {"num_householder": 2, "scale": 0.5, "initial_state": None, "output_final_state": False}
    assert calls == [{**agreed, "cu_seqlens": None}]

    def missing_kernel():
        raise ImportError("no module named titan_delta_kernels.gated_delta_product")

    monkeypatch.setattr(api, "_load_triton_kernel", missing_kernel)
    with pytest.raises(RuntimeError, match="backend='triton' needs titan_delta_kernels"):
        gated_delta_product(**x, num_householder=2, backend="triton")


def test_auto_fp32_householder_limit_is_the_kernels():
    """"auto" must not send fp32 inputs to a kernel that refuses them (the ops import no kernel eagerly)."""
    kernels_api = pytest.importorskip("titan_delta_kernels.gated_delta_product.api")
    assert api.MAX_FP32_HOUSEHOLDER == kernels_api.MAX_FP32_HOUSEHOLDER
