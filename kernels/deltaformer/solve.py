"""Backward solve by superblocks (width > 64) of the transposed stage-1 system (I + diag(β)P)ᵀ G = dU.

Inside a superblock a program per (b, h, value slice) walks the chunks backwards, adding the later chunks
it solved and applying the diagonal blocks' transposed inverses; value columns are independent, so several
programs share a (b, h) to fill the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E, load_tile, precisions
from titan_delta_kernels.deltaformer.config import LaunchConfig
from titan_delta_kernels.deltaformer.inverse import load_unit_lower_inverse


@triton.jit
def _solve_bwd_kernel(
    W, K, SRC, ALPHA, G, Y, BETA, LSE, LINV, SCALES, R, DOC_START, DOC_END, T, H, row_lo, row_hi, n_chunks,
    qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
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
        for t0 in range(c0 + BT, t_hi, BT):
            rows = t0 + tl.arange(0, BT)
            row_ok = rows < t_hi
            w = load_tile(W, rows, row_ok, b, h, T, H, D, offs_d, d_ok)
            lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
            y = load_tile(Y, rows, row_ok, b, h, T, H, DV, offs_v, v_ok)
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
            # the α-weighted part of dO reaches U through (P U) as well: add P_ccᵀ (α dO)_c of this chunk
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
        index = pid_bh * n_chunks + c0 // BT
        inv, factor = load_unit_lower_inverse(LINV + index * BT * BT, SCALES + index, BT)
        g_c = tl.dot(tl.trans(inv.to(tl.float32)), rhs, input_precision=INV_PREC) * factor
        tl.store(G + gy_ptrs, g_c, mask=gy_mask)
        tl.store(Y + gy_ptrs, (weighted - beta[:, None] * g_c).to(Y.dtype.element_ty), mask=gy_mask)
        tl.debug_barrier()  # the previous chunk reads these rows of Y back


def solve_backward(
    w: torch.Tensor, k: torch.Tensor, src: torch.Tensor, alpha: torch.Tensor | None, g: torch.Tensor,
    y: torch.Tensor, beta: torch.Tensor, lse: torch.Tensor, linv: torch.Tensor, scales: torch.Tensor,
    partial: torch.Tensor | None, doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, row_lo: int,
    row_hi: int, scale: float, cfg: LaunchConfig,
) -> None:
    """Transposed solve of rows [row_lo, row_hi) from the end: G (= dv) and the row cotangent
    Y = α·src − β·G of the stage-1 scores; ``partial`` = Σ over later superblocks of Pᵀ Y."""
    B, T, H, D = w.shape
    DV = src.shape[-1]
    warps, stages = cfg.solve_launch
    launch(
        _solve_bwd_kernel, (B * H, cdiv(DV, cfg.value_block)),
        w, k, src, alpha if alpha is not None else lse, g, y, beta, lse, linv, scales,
        partial if partial is not None else lse, doc_start if doc_start is not None else lse,
        doc_end if doc_end is not None else lse, T, H, row_lo, row_hi, linv.shape[1], scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=cfg.value_block, BT=cfg.chunk, HAS_R=partial is not None,
        HAS_ALPHA=alpha is not None, VARLEN=doc_start is not None, **precisions(w.dtype),
        num_warps=warps, num_stages=stages,
    )
