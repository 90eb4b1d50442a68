"""The short conv's backward kernel: the pre-activation's gradient dpre, from it dx and the weight
gradient's partial sums, in one pass over x and dy.

dx[r] needs dpre at the K − 1 rows after r. Recomputing the pre-activation there (K² products and K sigmoids
per element) would make the kernel instruction-bound far above its memory time on an H100, and a separate dx
pass costs a round trip of dpre through HBM (4 bytes per element); the kernel keeps each program's recent
dpre tiles in a small ring in global memory instead, which L2 holds.
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
    tap_weight,
    tile_rows,
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
def _ring_tap(RING, ring_rows, cols_local, SEQ_POS, rows, row_ok, T, s: tl.constexpr,
              HAS_SEQ_POS: tl.constexpr, RING_ROWS: tl.constexpr):  # fmt: skip
    """dpre[r + s] over the tile's rows r (``ring_rows``: their rows in the ring), read back from the ring
    (fp32), zero where tap s is not used: r + s outside r's batch row, or pos[r + s] < s. Read through L2
    (``.cg``): the ring's rows were written by other threads of the program since L1 last saw them."""
    t = rows % T
    ahead_ok = row_ok & (t + s < T)
    pos = positions(SEQ_POS, rows + s, t + s, ahead_ok, HAS_SEQ_POS)
    ring_rows = (ring_rows + s) & (RING_ROWS - 1)
    mask = (ahead_ok & (pos >= s))[:, None]
    ptrs = RING + ring_rows[:, None] * cols_local.shape[0] + cols_local[None, :]
    tile = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    return tile.to(tl.float32)


@triton.jit
def short_conv_bwd_kernel(
    X, W, SEQ_POS, DY, DX, RING, DW_PARTIAL, T, C, N, X_STRIDE, DX_STRIDE,
    K: tl.constexpr, HAS_SEQ_POS: tl.constexpr, ACTIVATION: tl.constexpr, NORM: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, TILES: tl.constexpr, RING_TILES: tl.constexpr,
):  # fmt: skip
    """The backward of one segment: dx[r] = Σ_s w_s · dpre[r + s] and DW_PARTIAL[program, :, K−1−j] =
    Σ_r x[r − j] · dpre[r] over the program's TILES row tiles, where dpre is ``_output_to_pre`` of dy with pre
    recomputed from x (dy itself without ACTIVATION and NORM). x and dx have rows X_STRIDE and DX_STRIDE apart
    (C channels of wider tensors), dy is contiguous [N, C].

    dx[r] needs dpre up to K − 1 rows ahead, which a tile of registers cannot shift. Each tile's dpre,
    rounded to x's dtype (the rounding autograd's SiLU backward applies), goes to the program's ring in RING
    ([programs, RING_TILES · BLOCK_T, BLOCK_C]; at least three tiles, so one barrier per tile orders its
    writes before the reads of the tile before it, and those reads before the slot is written again); the
    tile before it then takes its dx from there. The ring stays in L2, so dpre costs no HBM round trip. The
    program ends with the next program's first tile (the halo), whose dpre only serves the last tile's dx.

    Taps are unrolled up to 8 (``conv.MAX_KERNEL_SIZE``) as named values: each tap's weights are loaded once
    per program, and each shifted x tile once per tile, serving both the recomputed pre and the tap's weight
    gradient. Each tap accumulates its products in its own [BLOCK_T, BLOCK_C] registers and reduces over
    rows once per program, not once per tile: a row reduction crosses warps (shared memory and a barrier
    each). Taps ≥ K are pruned at compile time.

    The next tile's x and dy are loaded before the current tile's math (software prefetch: the loop's
    loads do not feed a dot, so Triton's pipeliner leaves them in place): twice the bytes in flight per
    program for a kernel bound by memory latency (docs/benchmarks.md, "Short causal conv"). The shifted x
    tiles x[r − j], j ≥ 1, reach back into rows already read (cache hits) and load within the iteration."""
    tl.static_assert(K - 1 <= BLOCK_T, "the halo of dx must lie within the next tile")
    tl.static_assert(RING_TILES >= 3 and (RING_TILES & (RING_TILES - 1)) == 0, "RING_TILES: power of 2, >= 3")
    RING_ROWS: tl.constexpr = RING_TILES * BLOCK_T
    cols_local = tl.arange(0, BLOCK_C)
    cols = tl.program_id(1) * BLOCK_C + cols_local
    col_ok = cols < C
    local = tl.arange(0, BLOCK_T)
    dtype: tl.constexpr = X.dtype.element_ty
    program = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    ring = RING + program.to(tl.int64) * RING_ROWS * BLOCK_C
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
    own_tiles = tl.minimum(TILES, tl.cdiv(N - first_row, BLOCK_T))
    end = tl.minimum(N, first_row + (TILES + 1) * BLOCK_T)  # the halo tile's rows included
    row0 = first_row
    row_ok, pos, x0, dy = _tile_loads(X, DY, SEQ_POS, row0, local, cols, col_ok, T, C, end, X_STRIDE,
                                      HAS_SEQ_POS)  # fmt: skip
    for i in range(own_tiles + 1):
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
        ring_rows = (i * BLOCK_T + local) & (RING_ROWS - 1)
        tl.store(ring + ring_rows[:, None] * BLOCK_C + cols_local[None, :], dpre.to(dtype))
        if i < own_tiles:
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
        tl.debug_barrier()
        if i > 0:
            prev = row0 - BLOCK_T
            rows = prev + local
            ok = rows < N
            slot = (i - 1) * BLOCK_T + local
            dx = _ring_tap(ring, slot, cols_local, SEQ_POS, rows, ok, T, 0, HAS_SEQ_POS, RING_ROWS) * w0
            if K > 1:
                dx += _ring_tap(ring, slot, cols_local, SEQ_POS, rows, ok, T, 1, HAS_SEQ_POS, RING_ROWS) * w1
            if K > 2:
                dx += _ring_tap(ring, slot, cols_local, SEQ_POS, rows, ok, T, 2, HAS_SEQ_POS, RING_ROWS) * w2
            if K > 3:
                dx += _ring_tap(ring, slot, cols_local, SEQ_POS, rows, ok, T, 3, HAS_SEQ_POS, RING_ROWS) * w3
            if K > 4:
                dx += _ring_tap(ring, slot, cols_local, SEQ_POS, rows, ok, T, 4, HAS_SEQ_POS, RING_ROWS) * w4
            if K > 5:
                dx += _ring_tap(ring, slot, cols_local, SEQ_POS, rows, ok, T, 5, HAS_SEQ_POS, RING_ROWS) * w5
            if K > 6:
                dx += _ring_tap(ring, slot, cols_local, SEQ_POS, rows, ok, T, 6, HAS_SEQ_POS, RING_ROWS) * w6
            if K > 7:
                dx += _ring_tap(ring, slot, cols_local, SEQ_POS, rows, ok, T, 7, HAS_SEQ_POS, RING_ROWS) * w7
            store_tile(DX + prev.to(tl.int64) * DX_STRIDE, local, ok, cols, col_ok, DX_STRIDE, dx)
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
