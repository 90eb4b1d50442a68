"""Wavefront solves: one program per (chunk, b, h), handing solved rows on through flags in memory.

Forward (per superblock, after ``prep.py``): chunk c adds Σ_j P_cj U_j over the superblock's earlier chunks
after one wait for chunk c − 1's flag, applies the prepared inverse, stores U_c and raises its flag, then
writes P·U and, for w = q, o. Backward: the transposed solve of a run of rows (all of them, or one
superblock after ``passes`` summed the rows after it), over later chunks after one wait for chunk c + 1's
flag; the rows each program streams also give its keys' gradient (the key kernel's pass on the superblock
path). A program derives its chunk from a ticket taken from an atomic counter, chunk-major, so it only
waits for programs with earlier tickets, resident or finished: no deadlock whatever order programs start in
(the decoupled look-back of single-pass scans). A flag is raised only after the program's wait, so one flag
vouches for all chunks before it. The interpreter runs programs in ticket order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E, precisions, tile_ptrs
from titan_delta_kernels.deltaformer.config import LaunchConfig
from titan_delta_kernels.deltaformer.inverse import load_unit_lower_inverse


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
def _add_chunk(acc, x, lse, row_ok, row_doc, K, U, T, H, b, h, j, qk_scale, D: tl.constexpr,
               DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, VARLEN: tl.constexpr,
               DOT_PREC: tl.constexpr):
    """acc + P[rows, chunk j]·U[chunk j], U read past L1, as other programs wrote it in this launch. Without
    documents nothing is masked: earlier keys precede every row, and rows past the end (x = lse = 0) get
    finite values that are never stored."""
    cols = j * BT + tl.arange(0, BT)
    offs_d = tl.arange(0, BD)
    kt = tl.load(tile_ptrs(K, cols, b, h, T, H, D, offs_d), mask=(offs_d < D)[None, :], other=0.0)
    if VARLEN:
        allowed = row_ok[:, None] & (cols >= 0)[None, :] & (cols[None, :] >= row_doc[:, None])
    s = tl.dot(x, tl.trans(kt), input_precision=DOT_PREC) * qk_scale
    p = tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0) if VARLEN else tl.exp2(s - lse[:, None])
    offs_v = tl.arange(0, BV)
    vals = tl.load(U + ((b * T + cols) * H + h)[:, None] * DV + offs_v[None, :], mask=(offs_v < DV)[None, :],
                   other=0.0, cache_modifier=".cg")
    return acc + tl.dot(p.to(vals.dtype), vals, input_precision=DOT_PREC)


@triton.jit
def _superblock_wave_kernel(
    X, K, V, U, PU, O, BETA, LSE, LINV, SCALES, R, FLAGS, COUNTER, DOC_START,
    T, H, BH, n_chunks, row_lo, row_hi, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    HAS_R: tl.constexpr, FUSED_OUT: tl.constexpr, VARLEN: tl.constexpr,
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
    acc = tl.load(R + vu_ptrs, mask=vu_mask, other=0.0) if HAS_R else tl.zeros([BT, BV], dtype=tl.float32)
    if c > j_lo:  # chunk c − 1's flag vouches for every earlier chunk of the superblock
        _wait_for(flags, c - 1)
    for j in range(j_lo, c):
        acc = _add_chunk(acc, x, lse, row_ok, row_doc, K, U, T, H, b, h, j, qk_scale, D, DV, BD, BV, BT,
                         VARLEN, DOT_PREC)
    beta = tl.load(BETA + (b * T + rows) * H + h, mask=row_ok, other=0.0).to(tl.float32)
    v = tl.load(V + vu_ptrs, mask=vu_mask, other=0.0).to(tl.float32)
    index = pid_bh * n_chunks + c
    inv, factor = load_unit_lower_inverse(LINV + index * BT * BT, SCALES + index, BT)
    u_c = tl.dot(inv.to(tl.float32), v - beta[:, None] * acc, input_precision=INV_PREC) * factor
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
def _add_later_chunk(acc, acc_k, kt, vals, cols, X, LSE, Y, DVEC, DOC_START, T, H, b, h, pid_bh, j, t_hi,
                     qk_scale, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
                     BT: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr):
    """(acc + P[rows of chunk j, cols]ᵀ·Y[rows of chunk j], acc_k + the same rows' part of the key
    gradient, dSᵀ·W with dS = P∘(Y·Uᵀ − D)): the transposed solve's sum and the key kernel's
    (``cols.py``) from one pass over the rows; the chunk's D and Y are ready once its flag is up."""
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
    pt = tl.where(allowed, tl.exp2(st - lse[None, :]), 0.0)
    offs_v = tl.arange(0, BV)
    y = tl.load(Y + ((b * T + rows) * H + h)[:, None] * DV + offs_v[None, :],
                mask=row_ok[:, None] & (offs_v < DV)[None, :], other=0.0, cache_modifier=".cg").to(kt.dtype)
    dvec = tl.load(DVEC + pid_bh * T + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
    acc += tl.dot(pt.to(kt.dtype), y, input_precision=DOT_PREC)
    dpt = tl.dot(vals, tl.trans(y), input_precision=DOT_PREC)  # [keys, rows]
    acc_k += tl.dot((pt * (dpt - dvec[None, :])).to(kt.dtype), w, input_precision=DOT_PREC)
    return acc, acc_k


@triton.jit
def _wave_bwd_kernel(
    X, K, U, SRC, G, Y, BETA, LSE, LINV, SCALES, PU, C, DVEC, DBETA, DK, R_G, R_K, FLAGS, COUNTER, DOC_START,
    DOC_END, T, H, BH, n_chunks, row_hi, qk_scale, scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    PROBE_IS_Q: tl.constexpr, HAS_R: tl.constexpr, VARLEN: tl.constexpr,
    DOT_PREC: tl.constexpr, INV_PREC: tl.constexpr,
):
    ticket = tl.atomic_add(COUNTER, 1)
    c = (row_hi + BT - 1) // BT - 1 - ticket // BH
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
    wk_mask = col_ok[:, None] & d_ok[None, :]
    gy_ptrs = ((b * T + cols) * H + h)[:, None] * DV + offs_v[None, :]
    gy_mask = col_ok[:, None] & (offs_v < DV)[None, :]
    row_ptrs = (b * T + cols) * H + h
    kt = tl.load(K + wk_ptrs, mask=wk_mask, other=0.0)
    vals = tl.load(U + gy_ptrs, mask=gy_mask, other=0.0).to(kt.dtype)
    lse_c = tl.load(LSE + pid_bh * T + cols, mask=col_ok, other=0.0)
    beta = tl.load(BETA + row_ptrs, mask=col_ok, other=0.0).to(tl.float32)
    if VARLEN:
        doc_c = tl.load(DOC_START + cols, mask=col_ok, other=0)
    # First what waits for no later chunk: the source and, for w = q, P_ccᵀ (α dO)_c (see ``solve.py``).
    acc = tl.load(SRC + gy_ptrs, mask=gy_mask, other=0.0).to(tl.float32)
    if PROBE_IS_Q:
        in_block = (offs[None, :] < offs[:, None]) & col_ok[:, None]  # [rows, keys] of this chunk
        if VARLEN:
            in_block = in_block & (cols[None, :] >= doc_c[:, None])
        w_c = tl.load(X + wk_ptrs, mask=wk_mask, other=0.0)
        s_cc = tl.dot(w_c, tl.trans(kt), input_precision=DOT_PREC) * qk_scale
        p_cc = tl.where(in_block, tl.exp2(s_cc - lse_c[:, None]), 0.0)
        # Stage 2's weight of (P U)_t in o_t, α_t = Z_t / (Z_t + e^{s_tt}), as ``rows.stage2_weights`` forms
        # it on the superblock path (its c_t follows the loop, where P U is loaded anyway)
        s_tt = tl.sum(w_c.to(tl.float32) * kt.to(tl.float32), 1) * qk_scale
        has_keys = (cols > doc_c) if VARLEN else (cols > 0)
        alpha = tl.where(has_keys, 1.0 / (1.0 + tl.exp2(s_tt - lse_c)), 0.0)
        weighted = alpha[:, None] * acc
        acc += tl.dot(tl.trans(p_cc).to(kt.dtype), weighted.to(kt.dtype), input_precision=DOT_PREC) - weighted
    if HAS_R:  # the rows after this superblock, summed by the key launch before this one
        acc += tl.load(R_G + gy_ptrs, mask=gy_mask, other=0.0)
    acc_k = tl.zeros([BT, BD], dtype=tl.float32)
    t_hi = tl.minimum(row_hi, tl.load(DOC_END + tl.minimum(c0 + BT, T) - 1)) if VARLEN else row_hi
    j_last = (t_hi - 1) // BT
    if c < j_last:  # chunk c + 1's flag vouches for every later chunk
        _wait_for(flags, c + 1)
    for j in range(c + 1, j_last + 1):
        acc, acc_k = _add_later_chunk(acc, acc_k, kt, vals, cols, X, LSE, Y, DVEC, DOC_START, T, H, b, h,
                                      pid_bh, j, t_hi, qk_scale, D, DV, BD, BV, BT, VARLEN, DOT_PREC)
    # Every tile the rest of the program reads is loaded here, before the inverse's product: each program's
    # own latency sets the launch's time (its chunk level fills the GPU), and the loads then overlap the
    # product instead of following it one after another. The source and W are loaded again rather than held
    # across the key loop, where registers are short.
    index = pid_bh * n_chunks + c
    inv, factor = load_unit_lower_inverse(LINV + index * BT * BT, SCALES + index, BT)
    pu = tl.load(PU + gy_ptrs, mask=gy_mask, other=0.0)
    if PROBE_IS_Q:
        src = tl.load(SRC + gy_ptrs, mask=gy_mask, other=0.0)
        u_c = tl.load(U + gy_ptrs, mask=gy_mask, other=0.0)  # in these rows' layout
    w_c = tl.load(X + wk_ptrs, mask=wk_mask, other=0.0)
    g_c = tl.dot(tl.trans(inv.to(tl.float32)), acc, input_precision=INV_PREC) * factor
    pu = pu.to(tl.float32)
    if PROBE_IS_Q:
        src = src.to(tl.float32)
        y_c = alpha[:, None] * src - beta[:, None] * g_c
        # c_t = dα_t α_t (1 − α_t), dα_t = dO_t·((P U)_t − U_t): the row kernel's diagonal term
        c_diag = tl.sum(src * (pu - u_c.to(tl.float32)), 1) * alpha * (1.0 - alpha)
        tl.store(C + row_ptrs, c_diag, mask=col_ok)
    else:
        y_c = -beta[:, None] * g_c
    # The score gradients' row term D_t = Y_t·(P U)_t − c_t from the fp32 rows in registers (the superblock
    # path: ``rows.score_cotangents``). Y is stored in the input dtype: every reader rounds it so for its
    # products, and the later-row streams read half the bytes of fp32.
    dvec = tl.sum(y_c * pu, 1)
    if PROBE_IS_Q:
        dvec -= c_diag
    tl.store(Y + gy_ptrs, y_c.to(Y.dtype.element_ty), mask=gy_mask)
    tl.store(DVEC + pid_bh * T + cols, dvec, mask=col_ok)
    _raise_flag(flags, c)  # earlier chunks read Y and D only; the rest follows off the chain
    tl.store(G + gy_ptrs, g_c.to(G.dtype.element_ty), mask=gy_mask)
    tl.store(DBETA + row_ptrs, (-tl.sum(g_c * pu, 1)).to(DBETA.dtype.element_ty), mask=col_ok)
    # The key gradient's own block: this chunk's keys against its later rows, as the loop's, with Y read back
    # as stored (the barrier before the flag made this program's stores visible to all its threads).
    st = tl.dot(kt, tl.trans(w_c), input_precision=DOT_PREC) * qk_scale  # [keys, rows]
    allowed = (offs[None, :] > offs[:, None]) & col_ok[None, :]
    if VARLEN:
        allowed = allowed & (doc_c[None, :] <= cols[:, None])
    pt = tl.where(allowed, tl.exp2(st - lse_c[None, :]), 0.0)
    y_own = tl.load(Y + gy_ptrs, mask=gy_mask, other=0.0).to(kt.dtype)
    dpt = tl.dot(vals, tl.trans(y_own), input_precision=DOT_PREC)
    acc_k += tl.dot((pt * (dpt - dvec[None, :])).to(kt.dtype), w_c, input_precision=DOT_PREC)
    acc_k = acc_k * scale
    if HAS_R:  # loaded only now: the loop holds no registers for it
        acc_k += tl.load(R_K + wk_ptrs, mask=wk_mask, other=0.0)
    if PROBE_IS_Q:  # w = q: the diagonal score s_ii of stage 2 has gradient −c_i
        acc_k -= scale * c_diag[:, None] * w_c.to(tl.float32)
    tl.store(DK + wk_ptrs, acc_k.to(DK.dtype.element_ty), mask=wk_mask)


def superblock_wave_solve(
    x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor, pu: torch.Tensor,
    o: torch.Tensor | None, beta: torch.Tensor, lse: torch.Tensor, linv: torch.Tensor, scales: torch.Tensor,
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
        x, k, v, u, pu, o if o is not None else pu, beta, lse, linv, scales,
        partial if partial is not None else lse, flags, counter,
        doc_start if doc_start is not None else flags, T, H, B * H, n_chunks, row_lo, row_hi, scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=chunk,
        HAS_R=partial is not None, FUSED_OUT=o is not None, VARLEN=doc_start is not None,
        **precisions(x.dtype), num_warps=warps, num_stages=stages,
    )


def wave_backward(
    x: torch.Tensor, k: torch.Tensor, u: torch.Tensor, src: torch.Tensor, g: torch.Tensor, y: torch.Tensor,
    beta: torch.Tensor, lse: torch.Tensor, linv: torch.Tensor, scales: torch.Tensor, pu: torch.Tensor,
    c: torch.Tensor | None, dvec: torch.Tensor, dbeta: torch.Tensor, dk: torch.Tensor,
    later: tuple[torch.Tensor, torch.Tensor] | None, flags: torch.Tensor, counter: torch.Tensor,
    doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, row_lo: int, row_hi: int, scale: float,
    cfg: LaunchConfig,
) -> None:
    """The transposed solve of rows [row_lo, row_hi), in place: G (= dv, in g's dtype), Y = α·src − β·G (in
    y's dtype), the row scalars ``rows.score_cotangents`` fills on the superblock path (``dvec``, ``dbeta``)
    and the key gradient of the stage-1 scores (``dk``, what ``cols.col_backward`` computes there). ``c``
    (fp32 [B, T, H]) is given for w = q (x is q, src is dO): the program of each chunk forms stage 2's
    diagonal weights α (kept in registers) and c (stored: the row kernel reads it), ``rows.stage2_weights``
    on the superblock path. ``linv``, ``scales``: the diagonal blocks' inverses and their factors
    (``inverse.diag_inverse``; built inside, they would set the kernel's register count). ``later``: fp32
    ([B, T, H, Dv], [B, T, H, D]) sums over the rows from ``row_hi`` on for these rows' keys (Σ Pᵀ Y and
    their part of dk, scaled), None when ``row_hi`` is T. ``flags``: zeroed int32, one per (b, h, chunk);
    ``counter``: a zeroed int32 ticket counter of its own for this launch."""
    B, T, H, D = x.shape
    DV = src.shape[-1]
    chunk = cfg.chunk
    warps, stages = cfg.wave_backward_launch
    r_g, r_k = later if later is not None else (dvec, dvec)
    launch(
        _wave_bwd_kernel, (cdiv(row_hi - row_lo, chunk) * B * H,),
        x, k, u, src, g, y, beta, lse, linv, scales, pu, c if c is not None else dvec, dvec, dbeta, dk,
        r_g, r_k, flags, counter, doc_start if doc_start is not None else flags,
        doc_end if doc_end is not None else flags, T, H, B * H, cdiv(T, chunk), row_hi, scale * LOG2_E, scale,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=chunk,
        PROBE_IS_Q=c is not None, HAS_R=later is not None, VARLEN=doc_start is not None,
        **precisions(x.dtype), num_warps=warps, num_stages=stages,
    )
