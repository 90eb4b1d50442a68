"""Column-parallel kernel: each program owns a block of keys and streams over the later rows that see them.

From the saved row normalisers it sums Σ_t P[t,i] Y_t (DO_DV: stage 2's dU, or later rows' part of the
blocked transposed solve, rows t ≥ row_from) and/or scale·Σ_t P[t,i](Y_t·V_i − D_t) X_t (DO_DK: dk).
The later-rows sum of one backward superblock owns few keys but streams over every later row: at long T
and few heads its key programs alone leave most SMs idle, so its rows are split over a third grid axis,
each split writing its own slab of a scratch buffer that the host sums in a fixed order (deterministic,
unlike atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E, dot_precision, load_tile, new_buffer, tile_ptrs
from titan_delta_kernels.deltaformer.config import LaunchConfig, later_rows_splits


@triton.jit
def _col_bwd_kernel(
    X, K, VALS, Y, LSE, DVEC, DIAG_C, DK, DVOUT, DOC_START, DOC_END, T, H, key_base, key_stop, row_from,
    split_rows, out_base, out_len, out_split_stride, qk_scale, scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    STRICT: tl.constexpr, DO_DV: tl.constexpr, DO_DK: tl.constexpr, HAS_DIAG: tl.constexpr,
    ROWS_FROM: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid_k = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)  # row split (DO_DV only; 0 of 1 otherwise)
    b = pid_bh // H
    h = pid_bh % H
    i0 = key_base + pid_k * BK
    cols = i0 + tl.arange(0, BK)
    col_ok = cols < key_stop
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    d_ok = offs_d < D
    v_ok = offs_v < DV
    kt = load_tile(K, cols, col_ok, b, h, T, H, D, offs_d, d_ok)
    if DO_DK:
        vals = load_tile(VALS, cols, col_ok, b, h, T, H, DV, offs_v, v_ok).to(kt.dtype)
    t_lo = row_from if ROWS_FROM else i0
    if VARLEN:
        last_key = tl.minimum(i0 + BK, key_stop) - 1
        t_hi = tl.load(DOC_END + last_key)
    else:
        t_hi = T
    t_lo = t_lo + pid_s * split_rows
    t_hi = tl.minimum(t_hi, t_lo + split_rows)
    acc_v = tl.zeros([BK, BV], dtype=tl.float32)
    acc_k = tl.zeros([BK, BD], dtype=tl.float32)
    for t0 in range(t_lo, t_hi, BT):
        rows = t0 + tl.arange(0, BT)
        row_ok = rows < t_hi
        x = load_tile(X, rows, row_ok, b, h, T, H, D, offs_d, d_ok)
        lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
        y = load_tile(Y, rows, row_ok, b, h, T, H, DV, offs_v, v_ok).to(kt.dtype)
        st = tl.dot(kt, tl.trans(x), input_precision=DOT_PREC) * qk_scale  # [BK, BT]
        allowed = col_ok[:, None] & row_ok[None, :]
        if STRICT:
            allowed = allowed & (rows[None, :] > cols[:, None])
        else:
            allowed = allowed & (rows[None, :] >= cols[:, None])
        if VARLEN:
            row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
            allowed = allowed & (row_doc[None, :] <= cols[:, None])
        pt = tl.where(allowed, tl.exp2(st - lse[None, :]), 0.0)
        if DO_DV:
            acc_v += tl.dot(pt.to(kt.dtype), y, input_precision=DOT_PREC)
        if DO_DK:
            dvec = tl.load(DVEC + pid_bh * T + rows, mask=row_ok, other=0.0)
            dpt = tl.dot(vals, tl.trans(y), input_precision=DOT_PREC)  # [BK, BT]
            dst = pt * (dpt - dvec[None, :])
            acc_k += tl.dot(dst.to(kt.dtype), x, input_precision=DOT_PREC)
    if DO_DV:
        out = tile_ptrs(DVOUT + pid_s * out_split_stride, cols - out_base, b, h, out_len, H, DV, offs_v)
        tl.store(out, acc_v.to(DVOUT.dtype.element_ty), mask=col_ok[:, None] & v_ok[None, :])
    if DO_DK:
        acc_k = acc_k * scale
        if HAS_DIAG:  # w = q: the diagonal score s_ii of stage 2 has gradient −c_i
            c = tl.load(DIAG_C + (b * T + cols) * H + h, mask=col_ok, other=0.0)
            x_cols = load_tile(X, cols, col_ok, b, h, T, H, D, offs_d, d_ok).to(tl.float32)
            acc_k -= scale * c[:, None] * x_cols
        tl.store(tile_ptrs(DK, cols, b, h, T, H, D, offs_d), acc_k.to(DK.dtype.element_ty),
                 mask=col_ok[:, None] & d_ok[None, :])


def col_backward(
    x: torch.Tensor, k: torch.Tensor, vals: torch.Tensor | None, y: torch.Tensor, lse: torch.Tensor,
    dvec: torch.Tensor | None, dk: torch.Tensor | None, dv_out: torch.Tensor | None,
    doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, scale: float, cfg: LaunchConfig, *,
    strict: bool, key_base: int = 0, key_stop: int | None = None, row_from: int | None = None,
    diag_c: torch.Tensor | None = None,
) -> None:
    """Launch over keys [key_base, key_stop); writes the DV-side sum to ``dv_out`` and/or ``dk``.

    With ``row_from`` and no ``dk`` the rows may be split (``later_rows_splits``); the splits' slabs are then
    summed into ``dv_out[:, key_base:key_stop]``."""
    B, T, H, D = x.shape
    DV = y.shape[-1]
    keys, block, warps, stages = cfg.tiles  # each program owns the row kernels' row tile as keys
    stop = T if key_stop is None else key_stop
    key_programs = cdiv(stop - key_base, keys)
    splits, split_rows = 1, T
    if row_from is not None and dk is None:
        splits, split_rows = later_rows_splits(T - row_from, block, key_programs * B * H, x.device)
    target = dv_out
    if splits > 1:  # every split writes a whole [B, stop - key_base, H, DV] slab, zeros where it saw no row
        target = new_buffer((splits, B, stop - key_base, H, DV), device=x.device, dtype=torch.float32)
    out_base, out_len = (key_base, stop - key_base) if splits > 1 else (0, T)
    launch(
        _col_bwd_kernel, (key_programs, B * H, splits),
        x, k, vals if vals is not None else lse, y, lse, dvec if dvec is not None else lse,
        diag_c if diag_c is not None else lse, dk if dk is not None else lse,
        target if target is not None else lse,
        doc_start if doc_start is not None else lse, doc_end if doc_end is not None else lse,
        T, H, key_base, stop, 0 if row_from is None else row_from, split_rows, out_base, out_len,
        B * out_len * H * DV, scale * LOG2_E, scale,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=block, BK=keys,
        STRICT=strict, DO_DV=dv_out is not None, DO_DK=dk is not None, HAS_DIAG=diag_c is not None,
        ROWS_FROM=row_from is not None, VARLEN=doc_start is not None,
        DOT_PREC=dot_precision(x.dtype), num_warps=warps, num_stages=stages,
    )
    if splits > 1:
        torch.sum(target, 0, out=dv_out[:, key_base:stop])
