"""Tile helpers shared by the short conv's Triton kernels (fwd.py, bwd.py).

Layout: [N = B·T, C] with channels contiguous; y and dy are contiguous, x and dx may be C channels of a
wider tensor (one GEMM's output for several convs, whose rows inductor may pad), their rows X_STRIDE and
DX_STRIDE elements apart. Tokens are addressed by their flat row r = b·T + t. The forward walks TILES
consecutive tiles of BLOCK_T rows × BLOCK_C channels per program; the K − 1 halo rows a tap reaches behind
are read as shifted, masked loads of the same tile, which hit L1/L2 (the previous tile just read them). The
backward walks rows one at a time (bwd.py). Tap j at row r reads x[r − j] (weight [:, K − 1 − j]) and is
used iff pos[r] ≥ j, where pos[r] = min(t, seq_pos[r]): t keeps it inside the batch row, seq_pos inside the
current document.

With L2 normalisation (``NORM``), a tile's BLOCK_C channels are exactly one group (a head): the group's norm
is a row reduction inside the tile.
"""

from __future__ import annotations

import triton
import triton.language as tl

L2_EPS = tl.constexpr(1e-12)  # F.normalize's default: y = u / max(‖u‖, eps)


@triton.jit
def positions(SEQ_POS, rows, t, ok, HAS_SEQ_POS: tl.constexpr):
    """How many tokens back a tap may reach from each row (see the module docstring)."""
    if HAS_SEQ_POS:
        return tl.minimum(t, tl.load(SEQ_POS + rows, mask=ok, other=0).to(tl.int32))
    return t


@triton.jit
def weight_tile(W, cols, col_ok, K: tl.constexpr, BLOCK_K: tl.constexpr, X_DTYPE: tl.constexpr):
    """[BLOCK_K, BLOCK_C] fp32: row j the weight of tap j (x[r − j]), rounded to x's dtype as the
    PyTorch path does. Loaded once per program; ``tap_row`` picks a row (loop-invariant, so the compiler
    hoists it out of the tile loop)."""
    taps = tl.arange(0, BLOCK_K)
    ptrs = W + cols[None, :] * K + (K - 1 - taps)[:, None]
    w = tl.load(ptrs, mask=(taps < K)[:, None] & col_ok[None, :], other=0.0)
    return w.to(X_DTYPE).to(tl.float32)


@triton.jit
def tap_row(weights, j, BLOCK_K: tl.constexpr):
    """[BLOCK_C] row j of ``weight_tile``."""
    return tl.sum(tl.where((tl.arange(0, BLOCK_K) == j)[:, None], weights, 0.0), axis=0)


@triton.jit
def load_tile(TILE, rows, ok, cols, col_ok, stride):
    """fp32 rows × cols of a [·, C] tensor with rows ``stride`` apart, rows counted from TILE (the tile's
    first row, so they may be negative; int32 offsets within the tile), zero where a row is not ok."""
    x = tl.load(TILE + rows[:, None] * stride + cols[None, :], mask=ok[:, None] & col_ok[None, :], other=0.0)
    return x.to(tl.float32)


@triton.jit
def store_tile(TILE, rows, ok, cols, col_ok, stride, value):
    mask = ok[:, None] & col_ok[None, :]
    tl.store(TILE + rows[:, None] * stride + cols[None, :], value.to(TILE.dtype.element_ty), mask=mask)


@triton.jit
def row_norm(u):
    """‖u_row‖ per row of a tile holding one group: [BLOCK_T, 1] fp32."""
    return tl.sqrt(tl.sum(u * u, axis=1))[:, None]


@triton.jit
def inverse_norm(norm):
    """1 / max(norm, eps): the factor F.normalize divides by."""
    return 1.0 / tl.maximum(norm, L2_EPS)
