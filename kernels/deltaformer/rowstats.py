"""Per-row scalars of the backward, one fused pass each instead of a chain of fp32 torch temporaries.

``stage2_weights`` (w = q only): α_t = Z_t / (Z_t + e^{s_tt}), the weight of (P U)_t in o_t, and
c_t = dα_t · α_t (1 − α_t) with dα_t = dO_t · ((P U)_t − U_t).
``score_cotangents``: D_t = Y_t · (P U)_t − c_t (the softmax-backward row term of stage 1, [B, H, T]) and
dβ_t = −G_t · (P U)_t.
Rows are the flattened (b, t, h) positions of the [B, T, H, *] layout.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2

_ROWS = 32


@triton.jit
def _stage2_weights_kernel(
    Q, K, DO, PU, U, LSE, DOC_START, ALPHA, C, n_rows, T, H, scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr,
    VARLEN: tl.constexpr,
):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    ok = r < n_rows
    t = (r // H) % T
    bh = (r // (T * H)) * H + r % H
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    dm = ok[:, None] & (offs_d < D)[None, :]
    vm = ok[:, None] & (offs_v < DV)[None, :]
    q = tl.load(Q + r[:, None] * D + offs_d[None, :], mask=dm, other=0.0).to(tl.float32)
    k = tl.load(K + r[:, None] * D + offs_d[None, :], mask=dm, other=0.0).to(tl.float32)
    s_tt = tl.sum(q * k, 1) * scale
    log_z = tl.load(LSE + bh * T + t, mask=ok, other=0.0) * 0.6931471805599453
    first = tl.load(DOC_START + t, mask=ok, other=0) if VARLEN else 0
    has_keys = t > first
    alpha = tl.where(has_keys, 1.0 / (1.0 + tl.exp(s_tt - log_z)), 0.0)
    do = tl.load(DO + r[:, None] * DV + offs_v[None, :], mask=vm, other=0.0).to(tl.float32)
    pu = tl.load(PU + r[:, None] * DV + offs_v[None, :], mask=vm, other=0.0).to(tl.float32)
    u = tl.load(U + r[:, None] * DV + offs_v[None, :], mask=vm, other=0.0).to(tl.float32)
    d_alpha = tl.sum(do * (pu - u), 1)
    tl.store(ALPHA + r, alpha, mask=ok)
    tl.store(C + r, d_alpha * alpha * (1.0 - alpha), mask=ok)


@triton.jit
def _score_cotangents_kernel(
    Y, G, PU, C, DVEC, DBETA, n_rows, T, H,
    DV: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr, HAS_C: tl.constexpr,
):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    ok = r < n_rows
    t = (r // H) % T
    bh = (r // (T * H)) * H + r % H
    offs_v = tl.arange(0, BV)
    vm = ok[:, None] & (offs_v < DV)[None, :]
    pu = tl.load(PU + r[:, None] * DV + offs_v[None, :], mask=vm, other=0.0).to(tl.float32)
    y = tl.load(Y + r[:, None] * DV + offs_v[None, :], mask=vm, other=0.0)
    g = tl.load(G + r[:, None] * DV + offs_v[None, :], mask=vm, other=0.0)
    dvec = tl.sum(y * pu, 1)
    if HAS_C:
        dvec -= tl.load(C + r, mask=ok, other=0.0)
    tl.store(DVEC + bh * T + t, dvec, mask=ok)
    tl.store(DBETA + r, (-tl.sum(g * pu, 1)).to(DBETA.dtype.element_ty), mask=ok)


def stage2_weights(
    q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, pu: torch.Tensor, u: torch.Tensor, lse: torch.Tensor,
    doc_start: torch.Tensor | None, alpha: torch.Tensor, c: torch.Tensor, *, scale: float,
) -> None:
    """Fill fp32 [B, T, H] ``alpha`` and ``c`` (see the module docstring)."""
    B, T, H, D = q.shape
    DV = u.shape[-1]
    n_rows = B * T * H
    launch(
        _stage2_weights_kernel, (cdiv(n_rows, _ROWS),),
        q, k, do, pu, u, lse, doc_start if doc_start is not None else lse, alpha, c, n_rows, T, H, scale,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BR=_ROWS,
        VARLEN=doc_start is not None,
    )


def score_cotangents(
    y: torch.Tensor, g: torch.Tensor, pu: torch.Tensor, c: torch.Tensor | None, dvec: torch.Tensor,
    dbeta: torch.Tensor,
) -> None:
    """Fill ``dvec`` (fp32 [B, H, T]) and ``dbeta`` ([B, T, H], β's dtype)."""
    B, T, H, DV = y.shape
    n_rows = B * T * H
    launch(
        _score_cotangents_kernel, (cdiv(n_rows, _ROWS),),
        y, g, pu, c if c is not None else dvec, dvec, dbeta, n_rows, T, H,
        DV=DV, BV=next_power_of_2(DV), BR=_ROWS, HAS_C=c is not None,
    )
