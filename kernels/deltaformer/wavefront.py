"""Wavefront solves: one program per (chunk, b, h), handing solved rows on through flags in memory.

Forward (per superblock, after ``prep.py``): chunk c adds Σ_j P_cj U_j over the superblock's earlier chunks
(the last WAVE_DEFER one by one as their flags rise), applies the prepared inverse, stores U_c and raises
its flag, then writes P·U and, for w = q, o. Backward: the whole transposed solve in one launch, over later
chunks. A program derives its chunk from a ticket taken from an atomic counter, chunk-major, so it only
waits for programs with earlier tickets, resident or finished: no deadlock whatever order programs start
in (the decoupled look-back of single-pass scans). A flag is raised only after all earlier chunks' waits,
so one flag vouches for all of them. The interpreter runs programs in ticket order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E, new_buffer, precisions, tile_ptrs
from titan_delta_kernels.deltaformer.config import WAVE_DEFER, LaunchConfig
from titan_delta_kernels.deltaformer.inverse import store_unit_lower_inverse


@triton.jit
def _wait_for(FLAGS, index):
    """Spin until flag ``index`` is set; acquire, so the rows its program stored before are visible."""
    while tl.atomic_add(FLAGS + index, 0, sem="acquire") == 0:
        pass


@triton.jit
def _raise_flag(FLAGS, index):
    tl.debug_barrier()  # every thread's stores of this chunk are issued before the release
    tl.atomic_xchg(FLAGS + index, 1, sem="release")


@triton.jit
def _add_chunk(acc, x, lse, row_ok, row_doc, K, U, flags, T, H, b, h, j, qk_scale, D: tl.constexpr,
               DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, WAIT: tl.constexpr,
               VARLEN: tl.constexpr, DOT_PREC: tl.constexpr):
    """acc + P[rows, chunk j]·U[chunk j]: P before the wait for the chunk's flag (WAIT), U read past L1, as
    other programs wrote it in this launch. Without documents nothing is masked: earlier keys precede every
    row, and rows past the end (x = lse = 0) get finite values that are never stored."""
    cols = j * BT + tl.arange(0, BT)
    offs_d = tl.arange(0, BD)
    kt = tl.load(tile_ptrs(K, cols, b, h, T, H, D, offs_d), mask=(offs_d < D)[None, :], other=0.0)
    if VARLEN:
        allowed = row_ok[:, None] & (cols >= 0)[None, :] & (cols[None, :] >= row_doc[:, None])
    s = tl.dot(x, tl.trans(kt), input_precision=DOT_PREC) * qk_scale
    p = tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0) if VARLEN else tl.exp2(s - lse[:, None])
    if WAIT:
        _wait_for(flags, j)
    offs_v = tl.arange(0, BV)
    vals = tl.load(U + ((b * T + cols) * H + h)[:, None] * DV + offs_v[None, :], mask=(offs_v < DV)[None, :],
                   other=0.0, cache_modifier=".cg")
    return acc + tl.dot(p.to(vals.dtype), vals, input_precision=DOT_PREC)


@triton.jit
def _superblock_wave_kernel(
    X, K, V, U, PU, O, BETA, LSE, LINV, R, FLAGS, COUNTER, DOC_START,
    T, H, BH, n_chunks, row_lo, row_hi, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    DEFER: tl.constexpr, HAS_R: tl.constexpr, FUSED_OUT: tl.constexpr, VARLEN: tl.constexpr,
    DOT_PREC: tl.constexpr, INV_PREC: tl.constexpr,
):
    ticket = tl.atomic_add(COUNTER, 1)
    c = row_lo // BT + ticket // BH
    pid_bh = ticket % BH
    b = pid_bh // H
    h = pid_bh % H
    flags = FLAGS + pid_bh * n_chunks
    offs = tl.arange(0, BT)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    c0 = c * BT
    rows = c0 + offs
    row_ok = rows < row_hi
    wk_ptrs = ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :]
    wk_mask = row_ok[:, None] & (offs_d < D)[None, :]
    vu_ptrs = ((b * T + rows) * H + h)[:, None] * DV + offs_v[None, :]
    vu_mask = row_ok[:, None] & (offs_v < DV)[None, :]
    x = tl.load(X + wk_ptrs, mask=wk_mask, other=0.0)
    lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
    if VARLEN:
        row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
        j_lo = tl.maximum(row_lo, tl.load(DOC_START + c0)) // BT
    else:
        row_doc = rows  # unused
        j_lo = row_lo // BT
    inv_base = LINV + (pid_bh * n_chunks + c) * BT * BT
    acc = tl.load(R + vu_ptrs, mask=vu_mask, other=0.0) if HAS_R else tl.zeros([BT, BV], dtype=tl.float32)
    j_def = tl.maximum(j_lo, c - DEFER)
    if j_def > j_lo:  # its flag vouches for every earlier chunk of the superblock it needed
        _wait_for(flags, j_def - 1)
    for j in range(j_lo, j_def):
        acc = _add_chunk(acc, x, lse, row_ok, row_doc, K, U, flags, T, H, b, h, j, qk_scale, D, DV, BD, BV,
                         BT, False, VARLEN, DOT_PREC)
    beta = tl.load(BETA + (b * T + rows) * H + h, mask=row_ok, other=0.0).to(tl.float32)
    v = tl.load(V + vu_ptrs, mask=vu_mask, other=0.0).to(tl.float32)
    inv = tl.load(inv_base + offs[:, None] * BT + offs[None, :])
    for i in tl.static_range(DEFER):  # the last DEFER chunks: scores first, values once solved
        j = c - DEFER + i
        if j >= j_lo:
            acc = _add_chunk(acc, x, lse, row_ok, row_doc, K, U, flags, T, H, b, h, j, qk_scale, D, DV, BD,
                             BV, BT, True, VARLEN, DOT_PREC)
    u_c = tl.dot(inv, v - beta[:, None] * acc, input_precision=INV_PREC)
    tl.store(U + vu_ptrs, u_c.to(U.dtype.element_ty), mask=vu_mask)
    _raise_flag(flags, c)  # the chain to the next chunk ends here; P·U and o follow off it
    k_c = tl.load(tile_ptrs(K, rows, b, h, T, H, D, offs_d), mask=wk_mask, other=0.0)
    s_cc = tl.dot(x, tl.trans(k_c), input_precision=DOT_PREC) * qk_scale
    in_block = (offs[None, :] < offs[:, None]) & row_ok[:, None]
    if VARLEN:
        in_block = in_block & (rows[None, :] >= row_doc[:, None])
    p_cc = tl.where(in_block, tl.exp2(s_cc - lse[:, None]), 0.0)
    pu = acc + tl.dot(p_cc.to(U.dtype.element_ty), u_c.to(U.dtype.element_ty), input_precision=DOT_PREC)
    tl.store(PU + vu_ptrs, pu.to(PU.dtype.element_ty), mask=vu_mask)
    if FUSED_OUT:  # o = α·PU + (1 − α)·U with α_t = Z_t / (Z_t + e^{s_tt})
        s_tt = tl.sum(tl.where(offs[:, None] == offs[None, :], s_cc, 0.0), 1)
        has_keys = (rows > row_doc) if VARLEN else (rows > 0)
        alpha = tl.where(has_keys, 1.0 / (1.0 + tl.exp2(s_tt - lse)), 0.0)
        o = alpha[:, None] * pu + (1.0 - alpha)[:, None] * u_c
        tl.store(O + vu_ptrs, o.to(O.dtype.element_ty), mask=vu_mask)


@triton.jit
def _add_later_chunk(acc, kt, cols, X, LSE, Y, DOC_START, flags, T, H, b, h, pid_bh, j, t_hi, qk_scale,
                     D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
                     WAIT: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr):
    """acc + P[rows of chunk j, cols]ᵀ·Y[rows of chunk j], as ``_add_chunk`` for the transposed solve."""
    rows = j * BT + tl.arange(0, BT)
    row_ok = rows < t_hi
    offs_d = tl.arange(0, BD)
    w = tl.load(X + ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
    st = tl.dot(kt, tl.trans(w), input_precision=DOT_PREC) * qk_scale  # [keys, rows]
    allowed = row_ok[None, :] & (cols >= 0)[:, None]
    if VARLEN:
        row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
        allowed = allowed & (row_doc[None, :] <= cols[:, None])
    pt = tl.where(allowed, tl.exp2(st - lse[None, :]), 0.0).to(kt.dtype)
    if WAIT:
        _wait_for(flags, j)
    offs_v = tl.arange(0, BV)
    y = tl.load(Y + ((b * T + rows) * H + h)[:, None] * DV + offs_v[None, :],
                mask=(rows < t_hi)[:, None] & (offs_v < DV)[None, :], other=0.0, cache_modifier=".cg")
    return acc + tl.dot(pt, y.to(pt.dtype), input_precision=DOT_PREC)


@triton.jit
def _wave_bwd_kernel(
    X, K, SRC, ALPHA, G, Y, BETA, LSE, LINV, PU, C, DVEC, DBETA, FLAGS, DOC_START, DOC_END,
    T, H, BH, n_chunks, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    LOG2_BT: tl.constexpr, DEFER: tl.constexpr, HAS_ALPHA: tl.constexpr, VARLEN: tl.constexpr,
    DOT_PREC: tl.constexpr, INV_PREC: tl.constexpr,
):
    ticket = tl.atomic_add(FLAGS + BH * n_chunks, 1)
    c = n_chunks - 1 - ticket // BH
    pid_bh = ticket % BH
    b = pid_bh // H
    h = pid_bh % H
    flags = FLAGS + pid_bh * n_chunks
    offs = tl.arange(0, BT)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    d_ok = offs_d < D
    c0 = c * BT
    cols = c0 + offs
    col_ok = cols < T
    wk_ptrs = ((b * T + cols) * H + h)[:, None] * D + offs_d[None, :]
    gy_ptrs = ((b * T + cols) * H + h)[:, None] * DV + offs_v[None, :]
    gy_mask = col_ok[:, None] & (offs_v < DV)[None, :]
    kt = tl.load(K + wk_ptrs, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    w_c = tl.load(X + wk_ptrs, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    lse_c = tl.load(LSE + pid_bh * T + cols, mask=col_ok, other=0.0)
    beta = tl.load(BETA + (b * T + cols) * H + h, mask=col_ok, other=0.0).to(tl.float32)
    in_block = (offs[None, :] < offs[:, None]) & col_ok[:, None]  # [rows, keys] of this chunk
    if VARLEN:
        doc_c = tl.load(DOC_START + cols, mask=col_ok, other=0)
        in_block = in_block & (cols[None, :] >= doc_c[:, None])
    s_cc = tl.dot(w_c, tl.trans(kt), input_precision=DOT_PREC) * qk_scale
    p_cc = tl.where(in_block, tl.exp2(s_cc - lse_c[:, None]), 0.0)
    inv_base = LINV + (pid_bh * n_chunks + c) * BT * BT
    # built first and parked in scratch memory: the key loop needs the registers
    store_unit_lower_inverse(inv_base, -p_cc * beta[:, None], BT, LOG2_BT, INV_PREC)
    tl.debug_barrier()
    # First what waits for no later chunk: the source and, for w = q, P_ccᵀ (α dO)_c (see ``solve.py``).
    src = tl.load(SRC + gy_ptrs, mask=gy_mask, other=0.0).to(tl.float32)
    if HAS_ALPHA:
        alpha = tl.load(ALPHA + (b * T + cols) * H + h, mask=col_ok, other=0.0)
        weighted = alpha[:, None] * src
        acc = src - weighted + tl.dot(tl.trans(p_cc).to(kt.dtype), weighted.to(kt.dtype),
                                      input_precision=DOT_PREC)
    else:
        acc = src
    t_hi = tl.minimum(T, tl.load(DOC_END + tl.minimum(c0 + BT, T) - 1)) if VARLEN else T
    j_last = (t_hi - 1) // BT
    if c + DEFER + 1 <= j_last:
        _wait_for(flags, c + DEFER + 1)
    for j in range(c + DEFER + 1, j_last + 1):  # long-solved later chunks
        acc = _add_later_chunk(acc, kt, cols, X, LSE, Y, DOC_START, flags, T, H, b, h, pid_bh, j, t_hi,
                               qk_scale, D, DV, BD, BV, BT, False, VARLEN, DOT_PREC)
    inv = tl.load(inv_base + offs[:, None] * BT + offs[None, :])
    for i in tl.static_range(DEFER):  # the next DEFER chunks: scores first, cotangents once solved
        j = c + DEFER - i
        if j <= j_last:
            acc = _add_later_chunk(acc, kt, cols, X, LSE, Y, DOC_START, flags, T, H, b, h, pid_bh, j, t_hi,
                                   qk_scale, D, DV, BD, BV, BT, True, VARLEN, DOT_PREC)
    g_c = tl.dot(tl.trans(inv), acc, input_precision=INV_PREC)
    y_c = alpha[:, None] * src - beta[:, None] * g_c if HAS_ALPHA else -beta[:, None] * g_c
    # Y in the input dtype: every reader rounds it to that dtype for its products anyway, and the later-row
    # streams here and in the key kernel read half the bytes of fp32
    tl.store(Y + gy_ptrs, y_c.to(Y.dtype.element_ty), mask=gy_mask)
    _raise_flag(flags, c)  # earlier chunks read Y only; the rest follows off the chain
    tl.store(G + gy_ptrs, g_c.to(G.dtype.element_ty), mask=gy_mask)
    # the score gradients' row scalars from the fp32 rows still in registers: D_t = Y_t·(P U)_t − c_t and
    # dβ_t = −G_t·(P U)_t (``rows.score_cotangents`` on the superblock path)
    row_ptrs = (b * T + cols) * H + h
    pu = tl.load(PU + gy_ptrs, mask=gy_mask, other=0.0).to(tl.float32)
    dvec = tl.sum(y_c * pu, 1)
    if HAS_ALPHA:
        dvec -= tl.load(C + row_ptrs, mask=col_ok, other=0.0)
    tl.store(DVEC + pid_bh * T + cols, dvec, mask=col_ok)
    tl.store(DBETA + row_ptrs, (-tl.sum(g_c * pu, 1)).to(DBETA.dtype.element_ty), mask=col_ok)


def superblock_wave_solve(
    x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor, pu: torch.Tensor,
    o: torch.Tensor | None, beta: torch.Tensor, lse: torch.Tensor, linv: torch.Tensor,
    partial: torch.Tensor | None, doc_start: torch.Tensor | None, flags: torch.Tensor, row_lo: int,
    row_hi: int, scale: float, cfg: LaunchConfig,
) -> None:
    """Rows [row_lo, row_hi) of U, P·U and (w = q) o from what the preparation launch left. ``flags``:
    zeroed int32, a flag per (b, h, chunk), then a ticket counter per superblock."""
    B, T, H, D = x.shape
    DV = v.shape[-1]
    chunk = cfg.chunk
    n_chunks = cdiv(T, chunk)
    counter = flags[B * H * n_chunks + row_lo // cfg.superblock:]
    warps, stages = cfg.wave_forward_launch
    launch(
        _superblock_wave_kernel, (cdiv(row_hi - row_lo, chunk) * B * H,),
        x, k, v, u, pu, o if o is not None else pu, beta, lse, linv, partial if partial is not None else lse,
        flags, counter, doc_start if doc_start is not None else flags, T, H, B * H, n_chunks, row_lo, row_hi,
        scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=chunk, DEFER=WAVE_DEFER,
        HAS_R=partial is not None, FUSED_OUT=o is not None, VARLEN=doc_start is not None,
        **precisions(x.dtype), num_warps=warps, num_stages=stages,
    )


def wave_backward(
    x: torch.Tensor, k: torch.Tensor, src: torch.Tensor, alpha: torch.Tensor | None, g: torch.Tensor,
    y: torch.Tensor, beta: torch.Tensor, lse: torch.Tensor, pu: torch.Tensor, c: torch.Tensor | None,
    dvec: torch.Tensor, dbeta: torch.Tensor, doc_start: torch.Tensor | None, doc_end: torch.Tensor | None,
    scale: float, cfg: LaunchConfig,
) -> None:
    """The whole transposed solve, in place: G (= dv, in g's dtype), Y = α·src − β·G (in y's dtype), and
    the row scalars ``rows.score_cotangents`` fills on the superblock path (``dvec``, ``dbeta``)."""
    B, T, H, D = x.shape
    DV = src.shape[-1]
    chunk = cfg.chunk
    n_chunks = cdiv(T, chunk)
    flags = torch.zeros(B * H * n_chunks + 1, device=x.device, dtype=torch.int32)  # and a ticket counter
    linv = new_buffer((B * H, n_chunks, chunk, chunk), device=x.device, dtype=torch.float32)
    warps, stages = cfg.wave_backward_launch
    launch(
        _wave_bwd_kernel, (n_chunks * B * H,),
        x, k, src, alpha if alpha is not None else lse, g, y, beta, lse, linv, pu,
        c if c is not None else dvec, dvec, dbeta,
        flags, doc_start if doc_start is not None else flags, doc_end if doc_end is not None else flags,
        T, H, B * H, n_chunks, scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=chunk,
        LOG2_BT=chunk.bit_length() - 1, DEFER=WAVE_DEFER, HAS_ALPHA=alpha is not None,
        VARLEN=doc_start is not None, **precisions(x.dtype), num_warps=warps, num_stages=stages,
    )
