"""The stage-1 triangular solves, blocked two levels deep.

Stage 1 is (I + diag(β)P) U = V with P[t,i] = exp2(s[t,i] − lse_t) for earlier keys of the same document;
its backward needs the transposed system (I + diag(β)P)ᵀ G = dU. Because the normalisers are computed
first, P is a fixed matrix and
  * the inverse of every diagonal chunk block, (I + β P_cc)⁻¹, depends on w, k, β only: all of them are
    built in one parallel launch (doubling: (I + βP_cc)⁻¹ = Π_j (I + X^(2^j)), X = −βP_cc nilpotent);
  * rows are grouped in superblocks. Contributions of other superblocks are plain matmuls done by the
    parallel row/column kernels; inside a superblock, one program per (b, h, value slice) walks its chunks
    in order, adds the contributions of the chunks already solved and applies the chunk's inverse.
The value columns of the system are independent, so the sequential walk is split over ``value_split``
programs per (b, h) to fill the GPU when B·H is small.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E, interpreting, new_buffer
from titan_delta_kernels.deltaformer.inverse import log2_split, store_unit_lower_inverse


@triton.jit
def _diag_inverse_kernel(
    W, K, BETA, LSE, LINV, DOC_START, T, H, n_chunks, qk_scale,
    D: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr, LOG2_BT: tl.constexpr,
    LOG2_SPLIT: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr, INV_PREC: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs = tl.arange(0, BT)
    rows = pid_c * BT + offs
    row_ok = rows < T
    offs_d = tl.arange(0, BD)
    d_ok = offs_d < D
    ptrs = ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :]
    w = tl.load(W + ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k = tl.load(K + ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
    beta = tl.load(BETA + (b * T + rows) * H + h, mask=row_ok, other=0.0).to(tl.float32)
    s = tl.dot(w, tl.trans(k), input_precision=DOT_PREC) * qk_scale
    allowed = (rows[None, :] < rows[:, None]) & row_ok[:, None]
    if VARLEN:
        row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
        allowed = allowed & (rows[None, :] >= row_doc[:, None])
    x = -tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0) * beta[:, None]
    store_unit_lower_inverse(LINV + (pid_bh * n_chunks + pid_c) * BT * BT, x, BT, LOG2_BT, LOG2_SPLIT,
                             INV_PREC)


@triton.jit
def _solve_fwd_kernel(
    W, K, V, U, PU, O, BETA, LSE, LINV, R, DOC_START,
    T, H, row_lo, row_hi, n_chunks, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
    HAS_R: tl.constexpr, FUSED_OUT: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
    INV_PREC: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs = tl.arange(0, BT)
    offs_d = tl.arange(0, BD)
    offs_v = pid_v * BV + tl.arange(0, BV)
    d_ok = offs_d < D
    v_ok = offs_v < DV
    for c0 in range(row_lo, row_hi, BT):
        rows = c0 + offs
        row_ok = rows < row_hi
        wk_ptrs = ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :]
        w = tl.load(W + wk_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
        vu_ptrs = ((b * T + rows) * H + h)[:, None] * DV + offs_v[None, :]
        vu_mask = row_ok[:, None] & v_ok[None, :]
        acc = tl.load(R + vu_ptrs, mask=vu_mask, other=0.0) if HAS_R else tl.zeros([BT, BV], dtype=tl.float32)
        if VARLEN:
            row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
            key_lo = tl.maximum(row_lo, tl.load(DOC_START + c0))
        else:
            key_lo = row_lo
        for i0 in range(key_lo, c0, BS):
            cols = i0 + tl.arange(0, BS)
            col_ok = cols < c0
            kt = tl.load(K + ((b * T + cols) * H + h)[:, None] * D + offs_d[None, :],
                         mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            u = tl.load(U + ((b * T + cols) * H + h)[:, None] * DV + offs_v[None, :],
                        mask=col_ok[:, None] & v_ok[None, :], other=0.0)
            s = tl.dot(w, tl.trans(kt), input_precision=DOT_PREC) * qk_scale
            allowed = col_ok[None, :]
            if VARLEN:
                allowed = allowed & (cols[None, :] >= row_doc[:, None])
            p = tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0)
            acc += tl.dot(p.to(u.dtype), u, input_precision=DOT_PREC)
        beta = tl.load(BETA + (b * T + rows) * H + h, mask=row_ok, other=0.0).to(tl.float32)
        v = tl.load(V + vu_ptrs, mask=vu_mask, other=0.0).to(tl.float32)
        inv = tl.load(LINV + (pid_bh * n_chunks + c0 // BT) * BT * BT + offs[:, None] * BT + offs[None, :])
        u_c = tl.dot(inv, v - beta[:, None] * acc, input_precision=INV_PREC)
        tl.store(U + vu_ptrs, u_c.to(U.dtype.element_ty), mask=vu_mask)
        # (P U) of these rows = earlier chunks (acc) + the diagonal block, for the backward (and o).
        k_c = tl.load(K + wk_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        s_cc = tl.dot(w, tl.trans(k_c), input_precision=DOT_PREC) * qk_scale
        in_block = (offs[None, :] < offs[:, None]) & row_ok[None, :]
        if VARLEN:
            in_block = in_block & (rows[None, :] >= row_doc[:, None])
        p_cc = tl.where(in_block, tl.exp2(s_cc - lse[:, None]), 0.0)
        pu = acc + tl.dot(p_cc.to(U.dtype.element_ty), u_c.to(U.dtype.element_ty), input_precision=DOT_PREC)
        tl.store(PU + vu_ptrs, pu.to(PU.dtype.element_ty), mask=vu_mask)
        if FUSED_OUT:
            # w = q: stage 2 sees the same scores plus the diagonal, so o = α·PU + (1 − α)·U with
            # α_t = Z_t / (Z_t + e^{s_tt}) (α = 0 when t has no earlier key in its document).
            s_tt = tl.sum(tl.where(offs[:, None] == offs[None, :], s_cc, 0.0), 1)
            has_keys = (rows > row_doc) if VARLEN else (rows > 0)
            alpha = tl.where(has_keys, 1.0 / (1.0 + tl.exp2(s_tt - lse)), 0.0)
            o = alpha[:, None] * pu + (1.0 - alpha)[:, None] * u_c
            tl.store(O + vu_ptrs, o.to(O.dtype.element_ty), mask=vu_mask)
        tl.debug_barrier()  # the next chunk reads these rows of U back


@triton.jit
def _solve_bwd_kernel(
    W, K, SRC, ALPHA, G, Y, BETA, LSE, LINV, R, DOC_START, DOC_END,
    T, H, row_lo, row_hi, n_chunks, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
    HAS_R: tl.constexpr, HAS_ALPHA: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
    INV_PREC: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs = tl.arange(0, BT)
    offs_d = tl.arange(0, BD)
    offs_v = pid_v * BV + tl.arange(0, BV)
    d_ok = offs_d < D
    v_ok = offs_v < DV
    n_local = tl.cdiv(row_hi - row_lo, BT)
    for j in range(0, n_local):
        c0 = row_lo + (n_local - 1 - j) * BT
        cols = c0 + offs
        col_ok = cols < row_hi
        wk_ptrs = ((b * T + cols) * H + h)[:, None] * D + offs_d[None, :]
        kt = tl.load(K + wk_ptrs, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        gy_ptrs = ((b * T + cols) * H + h)[:, None] * DV + offs_v[None, :]
        gy_mask = col_ok[:, None] & v_ok[None, :]
        acc = tl.load(R + gy_ptrs, mask=gy_mask, other=0.0) if HAS_R else tl.zeros([BT, BV], dtype=tl.float32)
        last_key = tl.minimum(c0 + BT, row_hi) - 1
        t_hi = tl.minimum(row_hi, tl.load(DOC_END + last_key)) if VARLEN else row_hi
        for t0 in range(c0 + BT, t_hi, BS):
            rows = t0 + tl.arange(0, BS)
            row_ok = rows < t_hi
            w = tl.load(W + ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :],
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
            y = tl.load(Y + ((b * T + rows) * H + h)[:, None] * DV + offs_v[None, :],
                        mask=row_ok[:, None] & v_ok[None, :], other=0.0)
            st = tl.dot(kt, tl.trans(w), input_precision=DOT_PREC) * qk_scale  # [keys, rows]
            allowed = row_ok[None, :]
            if VARLEN:
                row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
                allowed = allowed & (row_doc[None, :] <= cols[:, None])
            pt = tl.where(allowed, tl.exp2(st - lse[None, :]), 0.0)
            acc += tl.dot(pt.to(kt.dtype), y.to(kt.dtype), input_precision=DOT_PREC)
        src = tl.load(SRC + gy_ptrs, mask=gy_mask, other=0.0).to(tl.float32)
        beta = tl.load(BETA + (b * T + cols) * H + h, mask=col_ok, other=0.0).to(tl.float32)
        if HAS_ALPHA:
            # the α-weighted part of dO reaches U through (P U) as well: add P_ccᵀ (α dO)_c of this chunk.
            alpha = tl.load(ALPHA + (b * T + cols) * H + h, mask=col_ok, other=0.0)
            w_c = tl.load(W + wk_ptrs, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            lse_c = tl.load(LSE + pid_bh * T + cols, mask=col_ok, other=0.0)
            st_cc = tl.dot(kt, tl.trans(w_c), input_precision=DOT_PREC) * qk_scale  # [keys, rows]
            in_block = (offs[None, :] > offs[:, None]) & col_ok[None, :]
            if VARLEN:
                doc_c = tl.load(DOC_START + cols, mask=col_ok, other=0)
                in_block = in_block & (doc_c[None, :] <= cols[:, None])
            pt_cc = tl.where(in_block, tl.exp2(st_cc - lse_c[None, :]), 0.0)
            weighted = alpha[:, None] * src
            rhs = src - weighted + acc + tl.dot(pt_cc.to(kt.dtype), weighted.to(kt.dtype),
                                                input_precision=DOT_PREC)
        else:
            weighted = tl.zeros([BT, BV], dtype=tl.float32)
            rhs = src + acc
        inv = tl.load(LINV + (pid_bh * n_chunks + c0 // BT) * BT * BT + offs[:, None] * BT + offs[None, :])
        g_c = tl.dot(tl.trans(inv), rhs, input_precision=INV_PREC)
        tl.store(G + gy_ptrs, g_c, mask=gy_mask)
        tl.store(Y + gy_ptrs, weighted - beta[:, None] * g_c, mask=gy_mask)
        tl.debug_barrier()  # the previous chunk reads these rows of Y back


def diag_inverse(
    w: torch.Tensor, k: torch.Tensor, beta: torch.Tensor, lse: torch.Tensor, doc_start: torch.Tensor | None,
    *, scale: float, chunk: int, dot_prec: str, inv_prec: str, num_warps: int, inv_split: int = 1,
) -> torch.Tensor:
    """fp32 [B·H, n_chunks, chunk, chunk] inverses of the unit lower-triangular diagonal blocks
    (``inv_split`` block rows: ``inverse.store_unit_lower_inverse``)."""
    B, T, H, D = w.shape
    n_chunks = cdiv(T, chunk)
    linv = new_buffer((B * H, n_chunks, chunk, chunk), device=w.device, dtype=torch.float32)
    launch(
        _diag_inverse_kernel, (n_chunks, B * H),
        w, k, beta, lse, linv, doc_start if doc_start is not None else lse, T, H, n_chunks,
        scale * LOG2_E,
        D=D, BD=next_power_of_2(D), BT=chunk, LOG2_BT=chunk.bit_length() - 1,
        LOG2_SPLIT=log2_split(chunk, inv_split), VARLEN=doc_start is not None, DOT_PREC=dot_prec,
        INV_PREC=inv_prec, num_warps=num_warps,
    )
    return linv


def _value_slice(D: int, DV: int, value_split: int, num_warps: int) -> int:
    """Columns of U per solve program. Slices narrower than 64 columns (or than DV) are refused on the GPU:
    32-wide slices crashed with an illegal memory access on an H200 under Triton 3.6 (2026-11-21 runs 6
    and 7: D = 128 with vsplit=4 at 8 and at 4 warps, D = 64 with vsplit=2 at [8, 2048, 16, 64]), while
    the same layouts passed smaller GPU tests; the cause is not found. The CPU interpreter, which checks
    the slicing arithmetic in CI, takes any width."""
    bv = max(16, next_power_of_2(cdiv(DV, value_split)))
    if bv < min(64, next_power_of_2(DV)) and not interpreting():
        raise ValueError(f"DeltaFormer solve: value_split={value_split} leaves {bv}-wide value slices "
                         f"(DV={DV}, head dim {D}, {num_warps} warps); slices under 64 columns crashed on "
                         "an H200 (Triton 3.6): use a smaller vsplit")
    return bv


def solve_forward(
    w: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor, pu: torch.Tensor,
    o: torch.Tensor | None, beta: torch.Tensor, lse: torch.Tensor, linv: torch.Tensor,
    partial: torch.Tensor | None, doc_start: torch.Tensor | None, *, row_lo: int, row_hi: int, scale: float,
    chunk: int, solve_tile: int, value_split: int, dot_prec: str, inv_prec: str, num_warps: int,
    num_stages: int,
) -> None:
    """Solve rows [row_lo, row_hi) of U in place, with their (P U) rows and, when ``o`` is given (w = q),
    the stage-2 output; ``partial`` holds the already-summed contributions of earlier superblocks."""
    B, T, H, D = w.shape
    DV = v.shape[-1]
    bv = _value_slice(D, DV, value_split, num_warps)
    launch(
        _solve_fwd_kernel, (B * H, cdiv(DV, bv)),
        w, k, v, u, pu, o if o is not None else pu, beta, lse, linv, partial if partial is not None else lse,
        doc_start if doc_start is not None else lse, T, H, row_lo, row_hi, linv.shape[1],
        scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=bv, BT=chunk, BS=solve_tile, HAS_R=partial is not None,
        FUSED_OUT=o is not None, VARLEN=doc_start is not None, DOT_PREC=dot_prec, INV_PREC=inv_prec,
        num_warps=num_warps, num_stages=num_stages,
    )


def solve_backward(
    w: torch.Tensor, k: torch.Tensor, src: torch.Tensor, alpha: torch.Tensor | None, g: torch.Tensor,
    y: torch.Tensor, beta: torch.Tensor, lse: torch.Tensor, linv: torch.Tensor, partial: torch.Tensor | None,
    doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, *, row_lo: int, row_hi: int, scale: float,
    chunk: int, solve_tile: int, value_split: int, dot_prec: str, inv_prec: str, num_warps: int,
    num_stages: int,
) -> None:
    """Transposed solve of rows [row_lo, row_hi) from the end: G (= dv) and the row cotangent
    Y = α·src − β·G of the stage-1 scores; ``partial`` = Σ over later superblocks of Pᵀ Y."""
    B, T, H, D = w.shape
    DV = src.shape[-1]
    bv = _value_slice(D, DV, value_split, num_warps)
    launch(
        _solve_bwd_kernel, (B * H, cdiv(DV, bv)),
        w, k, src, alpha if alpha is not None else lse, g, y, beta, lse, linv,
        partial if partial is not None else lse, doc_start if doc_start is not None else lse,
        doc_end if doc_end is not None else lse, T, H, row_lo, row_hi, linv.shape[1],
        scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=bv, BT=chunk, BS=solve_tile, HAS_R=partial is not None,
        HAS_ALPHA=alpha is not None, VARLEN=doc_start is not None, DOT_PREC=dot_prec, INV_PREC=inv_prec,
        num_warps=num_warps, num_stages=num_stages,
    )
