"""The short causal depthwise convolution: Triton kernels and their ``torch.library`` custom ops.

Custom ops keep the Triton launches opaque to torch.compile (which traces the fake implementations) and carry
the autograd rule, so the op composes with FSDP2 and activation checkpointing like any aten op.

Layout: x, y, dy, dx are contiguous [N = B·T, C] (channels contiguous); tokens are addressed by their flat row
r = b·T + t. A program walks TILES consecutive tiles of BLOCK_T rows × BLOCK_C channels; the K − 1 halo rows
a tap reaches (behind in the forward, ahead in the backward's dx) are read as shifted, masked loads of the
same tile, which hit L1/L2 (the previous tile just read them). Tap j at row r reads x[r − j] (weight
[:, K − 1 − j]) and is used iff pos[r] ≥ j, where pos[r] = min(t, seq_pos[r]): t keeps it inside the batch
row, seq_pos inside the current document.

Forward: one kernel, y only (no activation is saved beyond the op's inputs). Backward, two kernels:
``dpre`` recomputes the pre-activation from x, writes dpre = dy · act'(pre) in x's dtype (the rounding
autograd's SiLU backward applies too) and dw as one fp32 partial sum per (program, channel, tap), summed
over programs afterwards (deterministic, no atomics); ``dx`` then sums w_s · dpre[r + s]. Each kernel has
its own tiling (``Tiling``): dpre carries K weight-gradient accumulators and runs smaller tiles. A single
fused backward would have to recompute pre at each of the K rows ahead (K² products and K sigmoids per
element), which makes it instruction-bound far above its memory time on an H100; the round trip of dpre costs
4 bytes per element instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from titan_delta_kernels._checks import check_same_device, check_tensor
from titan_delta_kernels._launch import cdiv, launch, next_power_of_2

Tensor = torch.Tensor

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_KERNEL_SIZE = 8  # taps are unrolled at compile time


@dataclass(frozen=True)
class Tiling:
    """A kernel's launch geometry: tiles of ``rows`` × ``channels``, ``tiles`` consecutive row tiles per
    program (the dpre kernel writes one dw partial per program, so programs of many rows keep the partials
    [B·T / (rows · tiles), C, K] small), ``num_warps`` warps."""

    rows: int
    channels: int
    tiles: int
    num_warps: int


# Forward and dx: 32 rows × 64 channels on 4 warps, 16 values per thread in 16-byte vectors. The dpre kernel
# holds K weight-gradient accumulators besides its tiles: 16 × 32 tiles (4 values per thread) were the
# fastest of the tilings timed (docs/benchmarks.md, "Short causal conv").
FORWARD_TILING = Tiling(rows=32, channels=64, tiles=4, num_warps=4)
DPRE_TILING = Tiling(rows=16, channels=32, tiles=8, num_warps=4)
DX_TILING = Tiling(rows=32, channels=64, tiles=4, num_warps=4)


@triton.jit
def _positions(SEQ_POS, rows, t, ok, HAS_SEQ_POS: tl.constexpr):
    """How many tokens back a tap may reach from each row (see the module docstring)."""
    if HAS_SEQ_POS:
        return tl.minimum(t, tl.load(SEQ_POS + rows, mask=ok, other=0).to(tl.int32))
    return t


@triton.jit
def _weights(W, cols, col_ok, K: tl.constexpr, BLOCK_K: tl.constexpr, X_DTYPE: tl.constexpr):
    """[BLOCK_K, BLOCK_C] fp32: row j the weight of tap j (x[r − j]), rounded to x's dtype as the
    PyTorch path does. Loaded once per program; ``_tap`` picks a row (loop-invariant, so the compiler
    hoists it out of the tile loop)."""
    taps = tl.arange(0, BLOCK_K)
    ptrs = W + cols[None, :] * K + (K - 1 - taps)[:, None]
    w = tl.load(ptrs, mask=(taps < K)[:, None] & col_ok[None, :], other=0.0)
    return w.to(X_DTYPE).to(tl.float32)


@triton.jit
def _tap(weights, j, BLOCK_K: tl.constexpr):
    """[BLOCK_C] row j of ``_weights``."""
    return tl.sum(tl.where((tl.arange(0, BLOCK_K) == j)[:, None], weights, 0.0), axis=0)


@triton.jit
def _tap_weight(W, cols, col_ok, K: tl.constexpr, j: tl.constexpr, X_DTYPE: tl.constexpr):
    """Row j of ``_weights`` loaded on its own (an L1 hit after the first tile), in the layout of the tile's
    columns. The dpre kernel takes its weights this way: the weight tile's per-tap row picks are cross-warp
    reductions and raised its registers to two programs per SM. The forward and dx keep the tile, which
    measured faster there (docs/benchmarks.md, "Short causal conv")."""
    w = tl.load(W + cols * K + (K - 1 - j), mask=col_ok, other=0.0)
    return w.to(X_DTYPE).to(tl.float32)


@triton.jit
def _load_tile(TILE, rows, ok, cols, col_ok, C):
    """fp32 rows × cols of a contiguous [·, C] tensor, rows counted from TILE (the tile's first row, so they
    may be negative; int32 offsets within the tile), zero where a row is not ok."""
    x = tl.load(TILE + rows[:, None] * C + cols[None, :], mask=ok[:, None] & col_ok[None, :], other=0.0)
    return x.to(tl.float32)


@triton.jit
def _store_tile(TILE, rows, ok, cols, col_ok, C, value):
    mask = ok[:, None] & col_ok[None, :]
    tl.store(TILE + rows[:, None] * C + cols[None, :], value.to(TILE.dtype.element_ty), mask=mask)


@triton.jit
def short_conv_fwd_kernel(
    X, W, SEQ_POS, Y, T, C, N,
    K: tl.constexpr, HAS_SEQ_POS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """y[r] = act(Σ_j w_j · x[r − j]) (tap j used iff pos[r] ≥ j) for TILES consecutive row tiles."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    w = _weights(W, cols, col_ok, K, BLOCK_K, X.dtype.element_ty)
    local = tl.arange(0, BLOCK_T)
    first_row = tl.program_id(0) * TILES * BLOCK_T
    for tile in range(tl.minimum(TILES, tl.cdiv(N - first_row, BLOCK_T))):  # the last group may be short
        row0 = first_row + tile * BLOCK_T
        rows = row0 + local
        row_ok = rows < N
        pos = _positions(SEQ_POS, rows, rows % T, row_ok, HAS_SEQ_POS)
        offset = row0.to(tl.int64) * C
        y = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(K):
            x = _load_tile(X + offset, local - j, row_ok & (pos >= j), cols, col_ok, C)
            y += x * _tap(w, j, BLOCK_K)[None, :]
        if ACTIVATION:
            y = y * tl.sigmoid(y)
        _store_tile(Y + offset, local, row_ok, cols, col_ok, C, y)


@triton.jit
def _tap_product(X_TILE, local, row_ok, pos, cols, col_ok, C, dpre, j: tl.constexpr):
    """x[r − j] · dpre[r] over the tile's rows (zero where tap j is not used): tap j's dw terms."""
    return _load_tile(X_TILE, local - j, row_ok & (pos >= j), cols, col_ok, C) * dpre


@triton.jit
def _store_dw(DW_ROW, cols, col_ok, K: tl.constexpr, acc, j: tl.constexpr):
    """DW_PARTIAL[program, :, K−1−j] = the row sum of tap j's accumulator."""
    tl.store(DW_ROW + cols * K + (K - 1 - j), tl.sum(acc, axis=0), mask=col_ok)


@triton.jit
def short_conv_bwd_dpre_kernel(
    X, W, SEQ_POS, DY, DPRE, DW_PARTIAL, T, C, N,
    K: tl.constexpr, HAS_SEQ_POS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """Backward, first pass: dpre = dy · act'(pre) with pre recomputed from x, stored in x's dtype (with
    ACTIVATION; else dpre is dy itself), and DW_PARTIAL[program, :, K−1−j] = Σ_r x[r − j] · dpre[r] (fp32
    dpre) over the program's TILES row tiles.

    Each tap accumulates its products in its own [BLOCK_T, BLOCK_C] registers and reduces over rows once per
    program, not once per tile: a row reduction crosses warps (shared memory and a barrier each). Taps are
    unrolled up to MAX_KERNEL_SIZE; the accumulators of taps ≥ K are never touched and compile away."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    local = tl.arange(0, BLOCK_T)
    acc0 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc4 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc5 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc6 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    acc7 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    first_row = tl.program_id(0) * TILES * BLOCK_T
    for tile in range(tl.minimum(TILES, tl.cdiv(N - first_row, BLOCK_T))):
        row0 = first_row + tile * BLOCK_T
        rows = row0 + local
        row_ok = rows < N
        pos = _positions(SEQ_POS, rows, rows % T, row_ok, HAS_SEQ_POS)
        offset = row0.to(tl.int64) * C
        dpre = _load_tile(DY + offset, local, row_ok, cols, col_ok, C)
        if ACTIVATION:
            pre = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
            for j in tl.static_range(K):
                x = _load_tile(X + offset, local - j, row_ok & (pos >= j), cols, col_ok, C)
                pre += x * _tap_weight(W, cols, col_ok, K, j, X.dtype.element_ty)[None, :]
            sig = tl.sigmoid(pre)
            dpre = dpre * sig * (1.0 + pre * (1.0 - sig))
            _store_tile(DPRE + offset, local, row_ok, cols, col_ok, C, dpre)
        # x tiles again (L1 hits): the loop above keeps no list of them
        acc0 += _tap_product(X + offset, local, row_ok, pos, cols, col_ok, C, dpre, 0)
        if K > 1:
            acc1 += _tap_product(X + offset, local, row_ok, pos, cols, col_ok, C, dpre, 1)
        if K > 2:
            acc2 += _tap_product(X + offset, local, row_ok, pos, cols, col_ok, C, dpre, 2)
        if K > 3:
            acc3 += _tap_product(X + offset, local, row_ok, pos, cols, col_ok, C, dpre, 3)
        if K > 4:
            acc4 += _tap_product(X + offset, local, row_ok, pos, cols, col_ok, C, dpre, 4)
        if K > 5:
            acc5 += _tap_product(X + offset, local, row_ok, pos, cols, col_ok, C, dpre, 5)
        if K > 6:
            acc6 += _tap_product(X + offset, local, row_ok, pos, cols, col_ok, C, dpre, 6)
        if K > 7:
            acc7 += _tap_product(X + offset, local, row_ok, pos, cols, col_ok, C, dpre, 7)
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
    w = _weights(W, cols, col_ok, K, BLOCK_K, DX.dtype.element_ty)
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
            pos = _positions(SEQ_POS, rows + s, t + s, ahead_ok, HAS_SEQ_POS)
            dpre = _load_tile(DPRE + offset, local + s, ahead_ok & (pos >= s), cols, col_ok, C)
            dx += dpre * _tap(w, s, BLOCK_K)[None, :]
        _store_tile(DX + offset, local, row_ok, cols, col_ok, C, dx)


def _constexprs(K: int, seq_pos: Tensor | None, tiling: Tiling, weight_tile: bool = True) -> dict:
    """The launch keywords of a kernel: filter width, tile geometry, whether documents are given, and the
    padded tap count of the weight tile (the kernels that load one)."""
    kw = dict(K=K, HAS_SEQ_POS=seq_pos is not None, BLOCK_T=tiling.rows, BLOCK_C=tiling.channels,
              TILES=tiling.tiles, num_warps=tiling.num_warps)  # fmt: skip
    return kw | dict(BLOCK_K=next_power_of_2(K)) if weight_tile else kw


def _grid(rows: int, channels: int, tiling: Tiling) -> tuple[int, int]:
    return cdiv(rows, tiling.rows * tiling.tiles), cdiv(channels, tiling.channels)


def _empty(shape, like: Tensor, dtype: torch.dtype) -> Tensor:
    """torch.empty, NaN-filled under TITAN_DELTA_POISON=1 (tests) so that unwritten elements show."""
    out = torch.empty(shape, device=like.device, dtype=dtype)
    return out.fill_(float("nan")) if os.environ.get("TITAN_DELTA_POISON") == "1" else out


def _inputs(x: Tensor, weight: Tensor, seq_pos: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Contiguous x and weight, and seq_pos (x as an unread stand-in when None), as the kernels index them."""
    x = x.contiguous()
    return x, weight.contiguous(), x if seq_pos is None else seq_pos.contiguous()


@torch.library.custom_op("titan_delta::short_conv_fwd", mutates_args=())
def short_conv_fwd(x: Tensor, weight: Tensor, seq_pos: Tensor | None, activation: bool) -> Tensor:
    """y [B, T, C] (contiguous, x's dtype) from x [B, T, C], weight [C, 1, K], seq_pos [B, T] or None."""
    B, T, C = x.shape
    y = _empty(x.shape, x, x.dtype)
    if y.numel() == 0:
        return y
    tiling = FORWARD_TILING
    launch(short_conv_fwd_kernel, _grid(B * T, C, tiling), *_inputs(x, weight, seq_pos), y, T, C, B * T,
           ACTIVATION=activation, **_constexprs(weight.shape[-1], seq_pos, tiling))  # fmt: skip
    return y


@short_conv_fwd.register_fake
def _(x, weight, seq_pos, activation):
    return x.new_empty(x.shape)


@torch.library.custom_op("titan_delta::short_conv_bwd", mutates_args=())
def short_conv_bwd(
    dy: Tensor, x: Tensor, weight: Tensor, seq_pos: Tensor | None, activation: bool
) -> tuple[Tensor, Tensor]:
    """(dx in x's dtype, dw in weight's dtype and shape), contiguous, from dy and the forward's inputs."""
    B, T, C = x.shape
    K = weight.shape[-1]
    dx = _empty(x.shape, x, x.dtype)
    if dx.numel() == 0:
        return dx, weight.new_zeros(weight.shape)
    x, weight_c, seq_pos_or_x = _inputs(x, weight, seq_pos)
    dy = dy.contiguous()
    grid = _grid(B * T, C, DPRE_TILING)
    partial = _empty((grid[0], C, K), x, torch.float32)
    dpre = _empty(x.shape, x, x.dtype) if activation else dy  # without activation, dpre is dy
    launch(short_conv_bwd_dpre_kernel, grid, x, weight_c, seq_pos_or_x, dy, dpre, partial, T, C, B * T,
           ACTIVATION=activation, **_constexprs(K, seq_pos, DPRE_TILING, weight_tile=False))  # fmt: skip
    launch(short_conv_bwd_dx_kernel, _grid(B * T, C, DX_TILING), dpre, weight_c, seq_pos_or_x, dx, T, C,
           B * T, **_constexprs(K, seq_pos, DX_TILING))  # fmt: skip
    return dx, partial.sum(0).view(weight.shape).to(weight.dtype)


@short_conv_bwd.register_fake
def _(dy, x, weight, seq_pos, activation):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, seq_pos, activation = inputs
    ctx.save_for_backward(x, weight, seq_pos)
    ctx.activation = activation


def _backward(ctx, dy):
    x, weight, seq_pos = ctx.saved_tensors
    dx, dw = short_conv_bwd(dy, x, weight, seq_pos, ctx.activation)
    return dx, dw, None, None


torch.library.register_autograd("titan_delta::short_conv_fwd", _backward, setup_context=_setup_context)


def short_causal_conv(
    x: Tensor, weight: Tensor, seq_pos: Tensor | None = None, activation: bool = True
) -> Tensor:
    """y_t = act(Σ_{j<K} weight[:, 0, K−1−j] · x_{t−j}) with taps before the document start read as zero.

    x [B, T, C] fp32/bf16/fp16 (any strides; copied when not contiguous); weight [C, 1, K] with K ≤ 8 (the
    taps are rounded to x's dtype, products accumulate in fp32, y is in x's dtype); ``seq_pos`` [B, T] (or
    broadcastable to it) integer position of each token inside its document, None when every row is one
    document; act = SiLU when ``activation`` else identity. Differentiable in x and weight (dw in weight's
    dtype). Runs on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
    """
    check_tensor("x", x, 3, "[B, T, C]", dtypes=KERNEL_DTYPES)
    check_tensor("weight", weight, 3, "[C, 1, K]", dtypes=KERNEL_DTYPES)
    B, T, C = x.shape
    K = weight.shape[-1]
    if weight.shape[:2] != (C, 1) or not 1 <= K <= MAX_KERNEL_SIZE:
        raise ValueError(f"weight must have shape [C, 1, K] = [{C}, 1, K] with 1 <= K <= {MAX_KERNEL_SIZE}, "
                         f"got {tuple(weight.shape)}")  # fmt: skip
    if seq_pos is not None:
        check_tensor("seq_pos", seq_pos, 2, "[B, T] (or [1, T])", dtypes=(torch.int32, torch.int64))
        seq_pos = seq_pos.expand(B, T).contiguous()
    check_same_device(x=x, weight=weight, seq_pos=seq_pos)
    return short_conv_fwd(x.contiguous(), weight, seq_pos, bool(activation))
