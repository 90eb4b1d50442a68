"""The DeltaFormer and Gated DeltaProduct mixers against token-by-token recurrences written from the
formulas, so the wiring around the ops (projections, GQA expansion, probe, β, gate, interleaving of the n_h
steps, convs, norms) is checked, not just the ops."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from titan_delta.models.components.rope import apply_rotary
from titan_delta.models.context import MixerContext
from titan_delta.models.mixers import (
    DeltaFormerAttention,
    DeltaFormerConfig,
    GatedDeltaProduct,
    GatedDeltaProductConfig,
)
from titan_delta.testing import assert_rel_close, poison_


def _deltaformer_reference(m: DeltaFormerAttention, x: torch.Tensor) -> torch.Tensor:
    c = m.config
    B, T, _ = x.shape
    q = m.wq(x).view(B, T, c.n_heads, c.head_dim)
    k = m.wk(x).view(B, T, c.n_kv_heads, c.head_dim)
    v = m.wv(x).view(B, T, c.n_kv_heads, c.head_dim)
    if m.q_norm is not None:
        q, k = m.q_norm(q), m.k_norm(k)
    if m.rope is not None:
        cos, sin = m.rope(torch.arange(T).expand(B, T))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    beta = torch.sigmoid(m.w_beta(x)) if m.w_beta is not None else torch.ones(B, T, c.n_heads, dtype=x.dtype)
    scale = c.head_dim**-0.5
    group = c.n_heads // c.n_kv_heads
    out = poison_(torch.empty(B, T, c.n_heads, c.head_dim, dtype=x.dtype))
    for h in range(c.n_heads):
        qh, kh, vh = q[:, :, h], k[:, :, h // group], v[:, :, h // group]
        wh = kh if c.probe == "k" else qh
        u = []
        for t in range(T):
            u_t = vh[:, t]
            if t > 0:
                p = torch.softmax(scale * torch.einsum("bd,bid->bi", wh[:, t], kh[:, :t]), dim=-1)
                u_t = u_t - beta[:, t, h, None] * torch.einsum("bi,bid->bd", p, torch.stack(u, 1))
            u.append(u_t)
        U = torch.stack(u, 1)
        for t in range(T):
            p = torch.softmax(scale * torch.einsum("bd,bid->bi", qh[:, t], kh[:, : t + 1]), dim=-1)
            out[:, t, h] = torch.einsum("bi,bid->bd", p, U[:, : t + 1])
    return m.wo(out.reshape(B, T, -1))


@pytest.mark.parametrize(
    ("probe", "beta", "n_kv_heads", "qk_norm", "use_rope"),
    [("q", "sigmoid", 4, False, True), ("k", "sigmoid", 2, True, True), ("k", "one", 1, False, False)],
)
def test_deltaformer_mixer_matches_recurrence(probe, beta, n_kv_heads, qk_norm, use_rope):
    config = DeltaFormerConfig(
        dim=16, n_heads=4, n_kv_heads=n_kv_heads, head_dim=6, probe=probe, beta=beta,
        qk_norm=qk_norm, use_rope=use_rope, backend="torch",
    )  # fmt: skip
    m = DeltaFormerAttention(config).double()
    m.init_weights(0.3, 0.3)
    assert (m.w_beta is None) == (beta == "one")
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    ctx = MixerContext(positions=torch.arange(9).expand(2, 9))
    assert_rel_close(m(x, ctx), _deltaformer_reference(m, x), 1e-10, f"deltaformer probe={probe}")


def _gdp_reference(m: GatedDeltaProduct, x: torch.Tensor) -> torch.Tensor:
    c = m.config
    B, T, _ = x.shape
    n, H, K, V = c.num_householder, c.n_heads, c.head_dim, c.head_v_dim
    if c.use_short_conv:
        qp, kp, vp = m.q_conv(m.q_proj(x)), m.k_conv(m.k_proj(x)), m.v_conv(m.v_proj(x))
    else:
        qp, kp, vp = F.silu(m.q_proj(x)), F.silu(m.k_proj(x)), F.silu(m.v_proj(x))
    q = F.normalize(qp.view(B, T, H, K), dim=-1)
    k = F.normalize(kp.view(B, T, n, H, K), dim=-1)  # channel order (step, head, dim)
    v = vp.view(B, T, n, H, V)
    beta = torch.sigmoid(m.b_proj(x)).view(B, T, n, H) * (2.0 if c.allow_neg_eigval else 1.0)
    if c.use_forget_gate:
        g = -m.A_log.exp() * F.softplus(m.a_proj(x) + m.dt_bias)  # [B, T, H]
    else:
        g = torch.zeros(B, T, H, dtype=x.dtype)  # no decay
    S = torch.zeros(B, H, K, V, dtype=x.dtype)
    out = poison_(torch.empty(B, T, H, V, dtype=x.dtype))
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        for j in range(n):
            kj, vj, bj = k[:, t, j], v[:, t, j], beta[:, t, j]
            residual = vj - torch.einsum("bhkv,bhk->bhv", S, kj)
            S = S + bj[..., None, None] * torch.einsum("bhk,bhv->bhkv", kj, residual)
        out[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * K**-0.5
    o = m.o_norm(out, m.g_proj(x).view(B, T, H, V)) if c.use_output_gate else m.o_norm(out)
    return m.o_proj(o.reshape(B, T, H * V))


@pytest.mark.parametrize(("num_householder", "allow_neg_eigval"), [(1, False), (2, True), (3, False)])
def test_gated_deltaproduct_mixer_matches_recurrence(num_householder, allow_neg_eigval):
    config = GatedDeltaProductConfig(
        dim=16, n_heads=2, head_dim=4, head_v_dim=8, num_householder=num_householder,
        allow_neg_eigval=allow_neg_eigval, backend="torch",
    )  # fmt: skip
    m = GatedDeltaProduct(config).double()
    m.init_weights(0.3, 0.3)
    with torch.no_grad():  # gates away from their tiny Mamba2 init so the decay matters in 11 steps
        m.dt_bias.fill_(math.log(math.expm1(0.5)))
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    assert_rel_close(m(x, MixerContext()), _gdp_reference(m, x), 1e-10, f"gdp n_h={num_householder}")


@pytest.mark.parametrize(
    ("forget_gate", "short_conv", "output_gate"),
    [(False, True, True), (True, False, True), (True, True, False), (False, False, False)],
)
def test_gated_deltaproduct_switches(forget_gate, short_conv, output_gate):
    """The paper's state-tracking variant (no gate, no convs, no output gate) and each switch alone:
    still the recurrence, and without the parts it switched off."""
    config = GatedDeltaProductConfig(
        dim=16, n_heads=2, head_dim=4, head_v_dim=8, num_householder=2, allow_neg_eigval=True,
        use_forget_gate=forget_gate, use_short_conv=short_conv, use_output_gate=output_gate, backend="torch",
    )  # fmt: skip
    m = GatedDeltaProduct(config).double()
    m.init_weights(0.3, 0.3)
    names = {name.split(".")[0] for name, _ in m.named_parameters()}
    assert ({"a_proj", "A_log", "dt_bias"} <= names) == forget_gate
    assert ({"q_conv", "k_conv", "v_conv"} <= names) == short_conv
    assert ("g_proj" in names) == output_gate
    if forget_gate:
        with torch.no_grad():
            m.dt_bias.fill_(math.log(math.expm1(0.5)))
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    assert_rel_close(m(x, MixerContext()), _gdp_reference(m, x), 1e-10, "gdp with switches")


def test_gated_deltaproduct_convolves_q_k_v_with_one_op(monkeypatch):
    """Without a cache q, k, v, β and dt come from one GEMM and its output goes through one short-conv op (the
    Triton op forced on CPU), which passes β's and dt's columns through: the recurrence's values and the
    separate projections' gradients (b_proj's and a_proj's among them)."""
    from titan_delta.models.components import short_conv as short_conv_module

    config = GatedDeltaProductConfig(dim=16, n_heads=2, head_dim=8, head_v_dim=16, backend="torch")
    m = GatedDeltaProduct(config)
    m.init_weights(0.3, 0.3)
    x = torch.randn(2, 11, 16)
    expected = _gdp_reference(m, x)
    params = [p for _, p in sorted(m.named_parameters())]
    expected_grads = torch.autograd.grad(expected.square().sum(), params)
    calls = []
    split = short_conv_module._load_triton_conv_split()
    monkeypatch.setattr(short_conv_module, "_kernel_applies", lambda x, weight, l2_group: True)
    monkeypatch.setattr(short_conv_module, "_load_triton_conv_split", lambda: calls.append(1) or split)
    got = m(x, MixerContext())
    assert calls == [1]
    assert_rel_close(got, expected, 1e-5, "gdp output")
    grads = torch.autograd.grad(got.square().sum(), params)
    for (name, _), a, e in zip(sorted(m.named_parameters()), grads, expected_grads, strict=True):
        assert_rel_close(a, e, 1e-4, f"gradient of {name}")
