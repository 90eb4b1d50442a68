"""The short conv's forward kernel: y = act(conv(x)), optionally L2-normalised per group of channels."""

from __future__ import annotations

import triton
import triton.language as tl

from titan_delta_kernels.short_conv.tiles import (
    inverse_norm,
    load_tile,
    positions,
    row_norm,
    store_tile,
    tap_row,
    weight_tile,
)


@triton.jit
def short_conv_fwd_kernel(
    X, W, SEQ_POS, Y, T, C, N, X_STRIDE,
    K: tl.constexpr, HAS_SEQ_POS: tl.constexpr, ACTIVATION: tl.constexpr, NORM: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """y[r] = act(Σ_j w_j · x[r − j]) (tap j used iff pos[r] ≥ j) for TILES consecutive row tiles; with NORM
    each row of the tile (one group of BLOCK_C channels) is divided by max(its L2 norm, eps) in fp32, before
    the one rounding to y's dtype. x's rows are X_STRIDE apart (x may be C channels of a wider tensor), y is
    contiguous [N, C]."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    w = weight_tile(W, cols, col_ok, K, BLOCK_K, X.dtype.element_ty)
    local = tl.arange(0, BLOCK_T)
    first_row = tl.program_id(0) * TILES * BLOCK_T
    for tile in range(tl.minimum(TILES, tl.cdiv(N - first_row, BLOCK_T))):  # the last group may be short
        row0 = first_row + tile * BLOCK_T
        rows = row0 + local
        row_ok = rows < N
        pos = positions(SEQ_POS, rows, rows % T, row_ok, HAS_SEQ_POS)
        xs = X + row0.to(tl.int64) * X_STRIDE
        y = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(K):
            x = load_tile(xs, local - j, row_ok & (pos >= j), cols, col_ok, X_STRIDE)
            y += x * tap_row(w, j, BLOCK_K)[None, :]
        if ACTIVATION:
            y = y * tl.sigmoid(y)
        if NORM:
            y = y * inverse_norm(row_norm(y))
        store_tile(Y + row0.to(tl.int64) * C, local, row_ok, cols, col_ok, C, y)
