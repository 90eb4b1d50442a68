"""Row-parallel kernels: each program owns query rows and streams over their keys, or owns rows alone.

``row_forward``: stage 2 for a separate w, a causal flash-attention forward over U with log2 normalisers.
``row_backward``: dX = scale·dS·K, dS = P∘(Y·Vᵀ − D): stage 2's dq (Y = dO, V = U) and stage 1's dw.
``stage2_weights``, ``score_cotangents``: the superblock backward's per-row scalars (width > 64; the wavefront
backward forms them itself), one fused pass each instead of a chain of fp32 torch temporaries.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E, dot_precision, load_tile, tile_ptrs
from titan_delta_kernels.deltaformer.config import LaunchConfig


@triton.jit
def _row_fwd_kernel(
    X, K, VALS, LSE, OUT, DOC_START, T, H, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    t0 = pid_t * BT
    rows = t0 + tl.arange(0, BT)
    row_ok = rows < T
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    d_ok = offs_d < D
    v_ok = offs_v < DV
    x = load_tile(X, rows, row_ok, b, h, T, H, D, offs_d, d_ok)
    if VARLEN:
        row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
        key_lo = tl.load(DOC_START + t0)
    else:
        key_lo = 0
    key_hi = tl.minimum(t0 + BT, T)
    m_i = tl.full([BT], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BT], dtype=tl.float32)
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    for i0 in range(key_lo, key_hi, BK):
        cols = i0 + tl.arange(0, BK)
        col_ok = cols < key_hi
        kt = load_tile(K, cols, col_ok, b, h, T, H, D, offs_d, d_ok)
        s = tl.dot(x, tl.trans(kt), input_precision=DOT_PREC) * qk_scale
        allowed = cols[None, :] <= rows[:, None]
        if VARLEN:
            allowed = allowed & (cols[None, :] >= row_doc[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        acc = acc * alpha[:, None]
        vals = load_tile(VALS, cols, col_ok, b, h, T, H, DV, offs_v, v_ok)
        acc += tl.dot(p.to(vals.dtype), vals, input_precision=DOT_PREC)
    has_keys = l_i > 0.0
    lse_out = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), 0.0)
    tl.store(LSE + pid_bh * T + rows, lse_out, mask=row_ok)
    acc = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    tl.store(tile_ptrs(OUT, rows, b, h, T, H, DV, offs_v), acc.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & v_ok[None, :])


@triton.jit
def _row_bwd_kernel(
    X, K, VALS, Y, LSE, DVEC, DIAG_C, DX, DOC_START, T, H, qk_scale, scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    STRICT: tl.constexpr, HAS_DIAG: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    t0 = pid_t * BT
    rows = t0 + tl.arange(0, BT)
    row_ok = rows < T
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    d_ok = offs_d < D
    v_ok = offs_v < DV
    x = load_tile(X, rows, row_ok, b, h, T, H, D, offs_d, d_ok)
    y = load_tile(Y, rows, row_ok, b, h, T, H, DV, offs_v, v_ok).to(x.dtype)
    lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
    dvec = tl.load(DVEC + pid_bh * T + rows, mask=row_ok, other=0.0)
    if VARLEN:
        row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
        key_lo = tl.load(DOC_START + t0)
    else:
        key_lo = 0
    key_hi = tl.minimum(t0 + BT, T)
    acc = tl.zeros([BT, BD], dtype=tl.float32)
    for i0 in range(key_lo, key_hi, BK):
        cols = i0 + tl.arange(0, BK)
        col_ok = cols < key_hi
        kt = load_tile(K, cols, col_ok, b, h, T, H, D, offs_d, d_ok)
        vals = load_tile(VALS, cols, col_ok, b, h, T, H, DV, offs_v, v_ok)
        s = tl.dot(x, tl.trans(kt), input_precision=DOT_PREC) * qk_scale
        allowed = (cols[None, :] < rows[:, None]) if STRICT else (cols[None, :] <= rows[:, None])
        if VARLEN:
            allowed = allowed & (cols[None, :] >= row_doc[:, None])
        p = tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(y, tl.trans(vals.to(x.dtype)), input_precision=DOT_PREC)
        ds = p * (dp - dvec[:, None])
        acc += tl.dot(ds.to(x.dtype), kt, input_precision=DOT_PREC)
    acc = acc * scale
    if HAS_DIAG:  # w = q: the diagonal score s_tt of stage 2 has gradient −c_t
        c = tl.load(DIAG_C + (b * T + rows) * H + h, mask=row_ok, other=0.0)
        k_rows = load_tile(K, rows, row_ok, b, h, T, H, D, offs_d, d_ok).to(tl.float32)
        acc -= scale * c[:, None] * k_rows
    tl.store(tile_ptrs(DX, rows, b, h, T, H, D, offs_d), acc.to(DX.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


def row_forward(
    x: torch.Tensor, k: torch.Tensor, vals: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
    doc_start: torch.Tensor | None, scale: float, cfg: LaunchConfig,
) -> None:
    """Causal flash-attention forward of ``x`` against (k, vals): ``out`` and its log2 normalisers ``lse``."""
    B, T, H, D = x.shape
    DV = vals.shape[-1]
    block, keys, warps, stages = cfg.tiles
    launch(
        _row_fwd_kernel, (cdiv(T, block), B * H),
        x, k, vals, lse, out, doc_start if doc_start is not None else lse, T, H, scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=block, BK=keys,
        VARLEN=doc_start is not None, DOT_PREC=dot_precision(x.dtype), num_warps=warps, num_stages=stages,
    )


def row_backward(
    x: torch.Tensor, k: torch.Tensor, vals: torch.Tensor, y: torch.Tensor, lse: torch.Tensor,
    dvec: torch.Tensor, dx: torch.Tensor, doc_start: torch.Tensor | None, scale: float, cfg: LaunchConfig, *,
    strict: bool, diag_c: torch.Tensor | None = None,
) -> None:
    """dX = scale · Σ_i P[t,i](Y_t·V_i − D_t) K_i into ``dx``, minus scale · c_t K_t given ``diag_c``."""
    B, T, H, D = x.shape
    DV = vals.shape[-1]
    block, keys, warps, stages = cfg.tiles
    launch(
        _row_bwd_kernel, (cdiv(T, block), B * H),
        x, k, vals, y, lse, dvec, diag_c if diag_c is not None else lse, dx,
        doc_start if doc_start is not None else lse, T, H, scale * LOG2_E, scale,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=block, BK=keys,
        STRICT=strict, HAS_DIAG=diag_c is not None, VARLEN=doc_start is not None,
        DOT_PREC=dot_precision(x.dtype), num_warps=warps, num_stages=stages,
    )


_ROWS = 32  # rows per program of the per-row scalar kernels


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
    SRC, ALPHA, BETA, G, PU, C, DVEC, DBETA, n_rows, T, H,
    DV: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr, HAS_ALPHA: tl.constexpr,
):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    ok = r < n_rows
    t = (r // H) % T
    bh = (r // (T * H)) * H + r % H
    offs_v = tl.arange(0, BV)
    vm = ok[:, None] & (offs_v < DV)[None, :]
    pu = tl.load(PU + r[:, None] * DV + offs_v[None, :], mask=vm, other=0.0).to(tl.float32)
    g = tl.load(G + r[:, None] * DV + offs_v[None, :], mask=vm, other=0.0)
    beta = tl.load(BETA + r, mask=ok, other=0.0).to(tl.float32)
    # Y = α·src − β·G again in fp32, as the solve formed it: the stored Y is rounded to the input dtype
    y = -beta[:, None] * g
    if HAS_ALPHA:
        src = tl.load(SRC + r[:, None] * DV + offs_v[None, :], mask=vm, other=0.0).to(tl.float32)
        y += tl.load(ALPHA + r, mask=ok, other=0.0)[:, None] * src
    dvec = tl.sum(y * pu, 1)
    if HAS_ALPHA:
        dvec -= tl.load(C + r, mask=ok, other=0.0)
    tl.store(DVEC + bh * T + t, dvec, mask=ok)
    tl.store(DBETA + r, (-tl.sum(g * pu, 1)).to(DBETA.dtype.element_ty), mask=ok)


def stage2_weights(
    q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, pu: torch.Tensor, u: torch.Tensor, lse: torch.Tensor,
    doc_start: torch.Tensor | None, alpha: torch.Tensor, c: torch.Tensor, *, scale: float,
) -> None:
    """Fill fp32 [B, T, H] α_t = Z_t / (Z_t + e^{s_tt}), the weight of (P U)_t in o_t, and
    c_t = dα_t · α_t (1 − α_t) with dα_t = dO_t · ((P U)_t − U_t)."""
    B, T, H, D = q.shape
    DV = u.shape[-1]
    n_rows = B * T * H
    launch(
        _stage2_weights_kernel, (cdiv(n_rows, _ROWS),),
        q, k, do, pu, u, lse, doc_start if doc_start is not None else lse, alpha, c, n_rows, T, H, scale,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BR=_ROWS, VARLEN=doc_start is not None,
    )


def score_cotangents(
    src: torch.Tensor, alpha: torch.Tensor | None, beta: torch.Tensor, g: torch.Tensor, pu: torch.Tensor,
    c: torch.Tensor | None, dvec: torch.Tensor, dbeta: torch.Tensor,
) -> None:
    """Fill ``dvec`` (fp32 [B, H, T]) with D_t = Y_t · (P U)_t − c_t, the softmax-backward row term of
    stage 1, and ``dbeta`` ([B, T, H], β's dtype) with dβ_t = −G_t · (P U)_t, from the fp32 G of the
    superblock backward solve (the wavefront backward computes both itself). ``alpha`` and ``c`` come
    together (w = q)."""
    B, T, H, DV = g.shape
    n_rows = B * T * H
    launch(
        _score_cotangents_kernel, (cdiv(n_rows, _ROWS),),
        src, alpha if alpha is not None else dvec, beta, g, pu, c if c is not None else dvec, dvec, dbeta,
        n_rows, T, H, DV=DV, BV=next_power_of_2(DV), BR=_ROWS, HAS_ALPHA=alpha is not None,
    )
