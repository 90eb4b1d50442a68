"""Row-parallel kernels: each program owns a block of query rows and streams over their keys.

``row_forward``: stage 2 with a separate probe w, a causal flash-attention forward over U that also stores
its log-normalisers (with w = q the wavefront solve writes o itself).
``row_backward``: the gradient into the query side of a softmax, dX = scale·dS·K with dS = P∘(Y·Vᵀ − D)
for a per-row cotangent Y and precomputed D: stage 2's dq (Y = dO, V = U, D = rowsum(dO∘o)) and stage 1's
dw (Y, D from the transposed solve, see ``passes``).
Scores are kept in the log2 domain (exp2); log-normalisers are stored that way, as fp32 [B, H, T].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E


@triton.jit
def _row_fwd_kernel(
    X, K, VALS, LSE, OUT, DOC_START,
    T, H, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
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
    x = tl.load(X + ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
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
        kt = tl.load(K + ((b * T + cols) * H + h)[:, None] * D + offs_d[None, :],
                     mask=col_ok[:, None] & d_ok[None, :], other=0.0)
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
        vals = tl.load(VALS + ((b * T + cols) * H + h)[:, None] * DV + offs_v[None, :],
                       mask=col_ok[:, None] & v_ok[None, :], other=0.0)
        acc += tl.dot(p.to(vals.dtype), vals, input_precision=DOT_PREC)
    has_keys = l_i > 0.0
    lse_out = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), 0.0)
    tl.store(LSE + pid_bh * T + rows, lse_out, mask=row_ok)
    acc = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    tl.store(OUT + ((b * T + rows) * H + h)[:, None] * DV + offs_v[None, :],
             acc.to(OUT.dtype.element_ty), mask=row_ok[:, None] & v_ok[None, :])


@triton.jit
def _row_bwd_kernel(
    X, K, VALS, Y, LSE, DVEC, DIAG_C, DX, DOC_START,
    T, H, qk_scale, scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr,
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
    x = tl.load(X + ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    y = tl.load(Y + ((b * T + rows) * H + h)[:, None] * DV + offs_v[None, :],
                mask=row_ok[:, None] & v_ok[None, :], other=0.0).to(x.dtype)
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
        kt = tl.load(K + ((b * T + cols) * H + h)[:, None] * D + offs_d[None, :],
                     mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        vals = tl.load(VALS + ((b * T + cols) * H + h)[:, None] * DV + offs_v[None, :],
                       mask=col_ok[:, None] & v_ok[None, :], other=0.0)
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
        k_rows = tl.load(K + ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :],
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        acc -= scale * c[:, None] * k_rows
    tl.store(DX + ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :],
             acc.to(DX.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def row_forward(
    x: torch.Tensor, k: torch.Tensor, vals: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
    doc_start: torch.Tensor | None, *, scale: float, block: int, keys: int, dot_prec: str, num_warps: int,
    num_stages: int,
) -> None:
    """Causal flash-attention forward of ``x`` against (k, vals): ``out`` and its log2 normalisers ``lse``."""
    B, T, H, D = x.shape
    DV = vals.shape[-1]
    launch(
        _row_fwd_kernel, (cdiv(T, block), B * H),
        x, k, vals, lse, out, doc_start if doc_start is not None else lse, T, H, scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=block, BK=keys,
        VARLEN=doc_start is not None, DOT_PREC=dot_prec, num_warps=num_warps, num_stages=num_stages,
    )


def row_backward(
    x: torch.Tensor, k: torch.Tensor, vals: torch.Tensor, y: torch.Tensor, lse: torch.Tensor,
    dvec: torch.Tensor, dx: torch.Tensor, doc_start: torch.Tensor | None, *, scale: float, strict: bool,
    diag_c: torch.Tensor | None = None, block: int, keys: int, dot_prec: str, num_warps: int, num_stages: int,
) -> None:
    """dX = scale · Σ_i P[t,i](Y_t·V_i − D_t) K_i into ``dx`` (the query-side softmax gradient), minus
    scale · c_t K_t when ``diag_c`` is given."""
    B, T, H, D = x.shape
    DV = vals.shape[-1]
    grid = (cdiv(T, block), B * H)
    launch(
        _row_bwd_kernel, grid,
        x, k, vals, y, lse, dvec, diag_c if diag_c is not None else lse, dx,
        doc_start if doc_start is not None else lse,
        T, H, scale * LOG2_E, scale,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=block, BK=keys,
        STRICT=strict, HAS_DIAG=diag_c is not None, VARLEN=doc_start is not None, DOT_PREC=dot_prec,
        num_warps=num_warps, num_stages=num_stages,
    )
