"""The short conv's backward kernels: ``dpre`` (the pre-activation's gradient and the weight gradient's
partial sums) and ``dx``.

A single fused backward would have to recompute the pre-activation at each of the K rows ahead (K² products
and K sigmoids per element), which makes it instruction-bound far above its memory time on an H100; the round
trip of dpre costs 4 bytes per element instead.
"""

from __future__ import annotations

import triton
import triton.language as tl

from titan_delta_kernels.short_conv.tiles import (
    L2_EPS,
    inverse_norm,
    load_tile,
    positions,
    row_norm,
    shifted_x,
    store_tile,
    tap_row,
    tap_weight,
    tile_rows,
    weight_tile,
)


@triton.jit
def _output_to_pre(grad, pre, ACTIVATION: tl.constexpr, NORM: tl.constexpr):
    """The gradient of pre from the gradient of the op's output, through L2 normalisation (NORM: u / max(‖u‖,
    eps) per row, the norm's gradient zero where eps won) and SiLU (ACTIVATION), all in fp32."""
    if ACTIVATION:
        sig = tl.sigmoid(pre)
        u = pre * sig
    else:
        u = pre
    if NORM:
        norm = row_norm(u)
        inv = inverse_norm(norm)
        y = u * inv
        along_y = tl.where(norm >= L2_EPS, tl.sum(y * grad, axis=1)[:, None], 0.0)
        grad = (grad - y * along_y) * inv
    if ACTIVATION:
        grad = grad * sig * (1.0 + pre * (1.0 - sig))
    return grad


@triton.jit
def _store_dw(DW_ROW, cols, col_ok, K: tl.constexpr, acc, j: tl.constexpr):
    """DW_PARTIAL[program, :, K−1−j] = the row sum of tap j's accumulator."""
    tl.store(DW_ROW + cols * K + (K - 1 - j), tl.sum(acc, axis=0), mask=col_ok)


@triton.jit
def _tile_loads(X, DY, SEQ_POS, row0, local, cols, col_ok, T, C, end, X_STRIDE, HAS_SEQ_POS: tl.constexpr):
    """The HBM reads of the row tile at row0 (rows from ``end`` on masked): (rows ok, positions, x, dy)."""
    row_ok, pos = tile_rows(SEQ_POS, row0, local, T, end, HAS_SEQ_POS)
    x = shifted_x(X + row0.to(tl.int64) * X_STRIDE, local, row_ok, pos, cols, col_ok, X_STRIDE, 0)
    dy = load_tile(DY + row0.to(tl.int64) * C, local, row_ok, cols, col_ok, C)
    return row_ok, pos, x, dy


@triton.jit
def short_conv_bwd_dpre_kernel(
    X, W, SEQ_POS, DY, DPRE, DW_PARTIAL, T, C, N, X_STRIDE,
    K: tl.constexpr, HAS_SEQ_POS: tl.constexpr, ACTIVATION: tl.constexpr, NORM: tl.constexpr,
    WRITE_DPRE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """Backward, first pass: dpre (``_output_to_pre`` of dy, pre recomputed from x; dy itself without
    ACTIVATION and NORM), stored in x's dtype with WRITE_DPRE (else the caller uses dy as dpre), and
    DW_PARTIAL[program, :, K−1−j] = Σ_r x[r − j] · dpre[r] (fp32 dpre) over the program's TILES row tiles.
    x and dpre have rows X_STRIDE apart (C channels of wider tensors), dy is contiguous [N, C].

    Taps are unrolled up to 8 (``conv.MAX_KERNEL_SIZE``) as named values: each tap's weights are loaded once
    per program, and each shifted x tile once per tile, serving both the recomputed pre and the tap's weight
    gradient. Each tap accumulates its products in its own [BLOCK_T, BLOCK_C] registers and reduces over
    rows once per program, not once per tile: a row reduction crosses warps (shared memory and a barrier
    each). Taps ≥ K are pruned at compile time.

    The next tile's x and dy are loaded before the current tile's math (software prefetch: the loop's
    loads do not feed a dot, so Triton's pipeliner leaves them in place): twice the bytes in flight per
    program for a kernel bound by memory latency (docs/benchmarks.md, "Short causal conv"). The shifted x
    tiles x[r − j], j ≥ 1, reach back into rows already read (cache hits) and load within the iteration."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    local = tl.arange(0, BLOCK_T)
    dtype: tl.constexpr = X.dtype.element_ty
    w0 = tap_weight(W, cols, col_ok, K, 0, dtype)
    if K > 1:
        w1 = tap_weight(W, cols, col_ok, K, 1, dtype)
    if K > 2:
        w2 = tap_weight(W, cols, col_ok, K, 2, dtype)
    if K > 3:
        w3 = tap_weight(W, cols, col_ok, K, 3, dtype)
    if K > 4:
        w4 = tap_weight(W, cols, col_ok, K, 4, dtype)
    if K > 5:
        w5 = tap_weight(W, cols, col_ok, K, 5, dtype)
    if K > 6:
        w6 = tap_weight(W, cols, col_ok, K, 6, dtype)
    if K > 7:
        w7 = tap_weight(W, cols, col_ok, K, 7, dtype)
    acc0 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc4 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc5 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc6 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc7 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    first_row = tl.program_id(0) * TILES * BLOCK_T
    end = tl.minimum(N, first_row + TILES * BLOCK_T)
    row0 = first_row
    row_ok, pos, x0, dy = _tile_loads(X, DY, SEQ_POS, row0, local, cols, col_ok, T, C, end, X_STRIDE,
                                      HAS_SEQ_POS)  # fmt: skip
    for _ in range(tl.minimum(TILES, tl.cdiv(N - first_row, BLOCK_T))):
        next_ok, next_pos, next_x0, next_dy = _tile_loads(X, DY, SEQ_POS, row0 + BLOCK_T, local, cols, col_ok,
                                                          T, C, end, X_STRIDE, HAS_SEQ_POS)  # fmt: skip
        xs = X + row0.to(tl.int64) * X_STRIDE
        pre = x0 * w0
        if K > 1:
            x1 = shifted_x(xs, local, row_ok, pos, cols, col_ok, X_STRIDE, 1)
            pre += x1 * w1
        if K > 2:
            x2 = shifted_x(xs, local, row_ok, pos, cols, col_ok, X_STRIDE, 2)
            pre += x2 * w2
        if K > 3:
            x3 = shifted_x(xs, local, row_ok, pos, cols, col_ok, X_STRIDE, 3)
            pre += x3 * w3
        if K > 4:
            x4 = shifted_x(xs, local, row_ok, pos, cols, col_ok, X_STRIDE, 4)
            pre += x4 * w4
        if K > 5:
            x5 = shifted_x(xs, local, row_ok, pos, cols, col_ok, X_STRIDE, 5)
            pre += x5 * w5
        if K > 6:
            x6 = shifted_x(xs, local, row_ok, pos, cols, col_ok, X_STRIDE, 6)
            pre += x6 * w6
        if K > 7:
            x7 = shifted_x(xs, local, row_ok, pos, cols, col_ok, X_STRIDE, 7)
            pre += x7 * w7
        dpre = dy
        if ACTIVATION or NORM:
            dpre = _output_to_pre(dpre, pre, ACTIVATION, NORM)
        if WRITE_DPRE:
            store_tile(DPRE + row0.to(tl.int64) * X_STRIDE, local, row_ok, cols, col_ok, X_STRIDE, dpre)
        acc0 += x0 * dpre
        if K > 1:
            acc1 += x1 * dpre
        if K > 2:
            acc2 += x2 * dpre
        if K > 3:
            acc3 += x3 * dpre
        if K > 4:
            acc4 += x4 * dpre
        if K > 5:
            acc5 += x5 * dpre
        if K > 6:
            acc6 += x6 * dpre
        if K > 7:
            acc7 += x7 * dpre
        row0, row_ok, pos, x0, dy = row0 + BLOCK_T, next_ok, next_pos, next_x0, next_dy
    dw_row = DW_PARTIAL + tl.program_id(0).to(tl.int64) * C * K
    _store_dw(dw_row, cols, col_ok, K, acc0, 0)
    if K > 1:
        _store_dw(dw_row, cols, col_ok, K, acc1, 1)
    if K > 2:
        _store_dw(dw_row, cols, col_ok, K, acc2, 2)
    if K > 3:
        _store_dw(dw_row, cols, col_ok, K, acc3, 3)
    if K > 4:
        _store_dw(dw_row, cols, col_ok, K, acc4, 4)
    if K > 5:
        _store_dw(dw_row, cols, col_ok, K, acc5, 5)
    if K > 6:
        _store_dw(dw_row, cols, col_ok, K, acc6, 6)
    if K > 7:
        _store_dw(dw_row, cols, col_ok, K, acc7, 7)


@triton.jit
def short_conv_bwd_dx_kernel(
    DPRE, W, SEQ_POS, DX, T, C, N,
    K: tl.constexpr, HAS_SEQ_POS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """Backward, second pass: dx[r] = Σ_s w_s · dpre[r + s], tap s used iff r + s is in r's batch row and
    pos[r + s] ≥ s (the halo: K − 1 rows ahead of the tile)."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    w = weight_tile(W, cols, col_ok, K, BLOCK_K, DX.dtype.element_ty)
    local = tl.arange(0, BLOCK_T)
    first_row = tl.program_id(0) * TILES * BLOCK_T
    for tile in range(tl.minimum(TILES, tl.cdiv(N - first_row, BLOCK_T))):
        row0 = first_row + tile * BLOCK_T
        rows = row0 + local
        row_ok = rows < N
        t = rows % T
        offset = row0.to(tl.int64) * C
        dx = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for s in tl.static_range(K):
            ahead_ok = row_ok & (t + s < T)
            pos = positions(SEQ_POS, rows + s, t + s, ahead_ok, HAS_SEQ_POS)
            dpre = load_tile(DPRE + offset, local + s, ahead_ok & (pos >= s), cols, col_ok, C)
            dx += dpre * tap_row(w, s, BLOCK_K)[None, :]
        store_tile(DX + offset, local, row_ok, cols, col_ok, C, dx)
