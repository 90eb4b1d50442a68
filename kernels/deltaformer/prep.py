"""Forward, first launch of each superblock: normalisers, sums over earlier superblocks, diagonal inverses.

Each program owns BT rows and streams, online-softmax style, over the keys of earlier superblocks with their
solved U, then over its superblock's keys up to the diagonal (scores only); it stores lse_t (log2) and
R_t = Σ_{i<row_lo} P[t,i] U_i, then builds (I + β P_cc)⁻¹ of its chunks from the stored normalisers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E, interpreting, load_tile, precisions, tile_ptrs
from titan_delta_kernels.deltaformer.config import LaunchConfig
from titan_delta_kernels.deltaformer.inverse import store_unit_lower_inverse


@triton.jit
def _online_step(x, kt, s_mask, m_i, l_i, qk_scale, DOT_PREC: tl.constexpr, MASKED: tl.constexpr = True):
    """One key tile of an online log-sum-exp: new max and sum, the rescale factor of what was accumulated,
    the tile's probabilities. MASKED=False: a tile every row sees whole (masking was the busiest pipe)."""
    s = tl.dot(x, tl.trans(kt), input_precision=DOT_PREC) * qk_scale
    if MASKED:
        s = tl.where(s_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # unmasked: finite, the tile has keys
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new) if MASKED else m_new
    p = tl.exp2(s - m_use[:, None])
    corr = tl.exp2(m_i - m_use)
    return m_new, l_i * corr + tl.sum(p, 1), corr, p


@triton.jit
def _prep_kernel(
    X, K, U, BETA, LSE, R, LINV, SCALES, DOC_START, T, H, row_lo, row_hi, n_chunks, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    CHUNK: tl.constexpr, LOG2_CHUNK: tl.constexpr, HAS_VALUES: tl.constexpr, FULL_TILES: tl.constexpr,
    VARLEN: tl.constexpr, DOT_PREC: tl.constexpr, INV_PREC: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    t0 = row_lo + pid_t * BT
    rows = t0 + tl.arange(0, BT)
    row_ok = rows < row_hi
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    d_ok = offs_d < D
    v_ok = offs_v < DV
    vu_ptrs = ((b * T + rows) * H + h)[:, None] * DV + offs_v[None, :]
    x = load_tile(X, rows, row_ok, b, h, T, H, D, offs_d, d_ok)
    if VARLEN:
        row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
        key_lo = tl.load(DOC_START + t0)
        own_lo = tl.maximum(key_lo, row_lo)
    else:
        key_lo = 0
        own_lo = row_lo
    m_i = tl.full([BT], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BT], dtype=tl.float32)
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    if HAS_VALUES and FULL_TILES:  # 1. keys of solved superblocks, whole tiles: no mask at all
        for i0 in range(key_lo, row_lo, BK):
            cols = i0 + tl.arange(0, BK)
            kt = tl.load(tile_ptrs(K, cols, b, h, T, H, D, offs_d), mask=d_ok[None, :], other=0.0)
            m_i, l_i, corr, p = _online_step(x, kt, None, m_i, l_i, qk_scale, DOT_PREC, False)
            vals = tl.load(tile_ptrs(U, cols, b, h, T, H, DV, offs_v), mask=v_ok[None, :], other=0.0)
            acc = acc * corr[:, None] + tl.dot(p.to(vals.dtype), vals, input_precision=DOT_PREC)
    elif HAS_VALUES:  # 1. keys of solved superblocks: all before every row, only documents mask
        for i0 in range(key_lo, row_lo, BK):
            cols = i0 + tl.arange(0, BK)
            col_ok = cols < row_lo
            kt = load_tile(K, cols, col_ok, b, h, T, H, D, offs_d, d_ok)
            allowed = col_ok[None, :] & row_ok[:, None]
            if VARLEN:
                allowed = allowed & (cols[None, :] >= row_doc[:, None])
            m_i, l_i, corr, p = _online_step(x, kt, allowed, m_i, l_i, qk_scale, DOT_PREC)
            vals = load_tile(U, cols, col_ok, b, h, T, H, DV, offs_v, v_ok)
            acc = acc * corr[:, None] + tl.dot(p.to(vals.dtype), vals, input_precision=DOT_PREC)
    diag_lo = own_lo
    if not VARLEN:  # 2a. whole key tiles of this superblock before the row tile: no mask
        diag_lo = own_lo + (t0 - own_lo) // BK * BK
        for i0 in range(own_lo, diag_lo, BK):
            cols = i0 + tl.arange(0, BK)
            kt = tl.load(tile_ptrs(K, cols, b, h, T, H, D, offs_d), mask=d_ok[None, :], other=0.0)
            m_i, l_i, corr, _ = _online_step(x, kt, None, m_i, l_i, qk_scale, DOT_PREC, False)
            if HAS_VALUES:
                acc = acc * corr[:, None]
    for i0 in range(diag_lo, t0 + BT, BK):  # 2. this superblock up to the diagonal: normaliser only
        cols = i0 + tl.arange(0, BK)
        kt = tl.load(tile_ptrs(K, cols, b, h, T, H, D, offs_d), mask=(cols < T)[:, None] & d_ok[None, :],
                     other=0.0)
        allowed = (cols[None, :] < rows[:, None]) & row_ok[:, None]
        if VARLEN:
            allowed = allowed & (cols[None, :] >= row_doc[:, None])
        m_i, l_i, corr, _ = _online_step(x, kt, allowed, m_i, l_i, qk_scale, DOT_PREC)
        if HAS_VALUES:
            acc = acc * corr[:, None]
    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    tl.store(LSE + pid_bh * T + rows, tl.where(has_keys, m_i + tl.log2(l_safe), 0.0), mask=row_ok)
    if HAS_VALUES:
        tl.store(R + vu_ptrs, acc / l_safe[:, None], mask=row_ok[:, None] & v_ok[None, :])
    tl.debug_barrier()  # the inverses read these normalisers back
    offs_c = tl.arange(0, CHUNK)
    for c in tl.static_range(BT // CHUNK):  # (I + β P_cc)⁻¹ of the row tile's chunks
        c0 = t0 + c * CHUNK
        crow = c0 + offs_c
        c_ok = crow < row_hi
        ptrs = ((b * T + crow) * H + h)[:, None] * D + offs_d[None, :]
        w_c = tl.load(X + ptrs, mask=c_ok[:, None] & d_ok[None, :], other=0.0)
        k_c = tl.load(K + ptrs, mask=c_ok[:, None] & d_ok[None, :], other=0.0)
        lse_c = tl.load(LSE + pid_bh * T + crow, mask=c_ok, other=0.0)
        beta_c = tl.load(BETA + (b * T + crow) * H + h, mask=c_ok, other=0.0).to(tl.float32)
        s = tl.dot(w_c, tl.trans(k_c), input_precision=DOT_PREC) * qk_scale
        allowed = (crow[None, :] < crow[:, None]) & c_ok[:, None]
        if VARLEN:
            doc_c = tl.load(DOC_START + crow, mask=c_ok, other=0)
            allowed = allowed & (crow[None, :] >= doc_c[:, None])
        neg = -tl.where(allowed, tl.exp2(s - lse_c[:, None]), 0.0) * beta_c[:, None]
        if c0 < row_hi:  # superblocks hold whole chunks
            index = pid_bh * n_chunks + c0 // CHUNK
            store_unit_lower_inverse(LINV + index * CHUNK * CHUNK, SCALES + index, neg, CHUNK, LOG2_CHUNK,
                                     INV_PREC)


def prep_superblock(
    x: torch.Tensor, k: torch.Tensor, u: torch.Tensor, beta: torch.Tensor, lse: torch.Tensor,
    partial: torch.Tensor | None, linv: torch.Tensor, scales: torch.Tensor, doc_start: torch.Tensor | None,
    row_lo: int, row_hi: int, scale: float, cfg: LaunchConfig,
) -> None:
    """Rows [row_lo, row_hi): ``lse``, ``partial`` (Σ of P·U over keys before row_lo), ``linv`` and its
    ``scales`` (``inverse.inverse_buffers``)."""
    B, T, H, D = x.shape
    DV = u.shape[-1]
    rows, keys, warps, stages = cfg.prep
    chunk, cap = cfg.chunk, cfg.prep_registers
    launch(
        _prep_kernel, (cdiv(row_hi - row_lo, rows), B * H),
        x, k, u, beta, lse, partial if partial is not None else lse, linv, scales,
        doc_start if doc_start is not None else lse, T, H, row_lo, row_hi, linv.shape[1], scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=rows, BK=keys,
        CHUNK=chunk, LOG2_CHUNK=chunk.bit_length() - 1, HAS_VALUES=row_lo > 0,
        FULL_TILES=doc_start is None and row_lo % keys == 0, VARLEN=doc_start is not None,
        **precisions(x.dtype), num_warps=warps, num_stages=stages,
        **({"maxnreg": cap} if cap and not interpreting() else {}),
    )
