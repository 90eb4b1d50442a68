"""The short causal depthwise convolution as ``torch.library`` custom ops around its Triton kernels.

Custom ops keep the Triton launches opaque to torch.compile (which traces the fake implementations) and carry
the autograd rule, so the op composes with FSDP2 and activation checkpointing like any aten op.

One op call convolves one or several *segments*: consecutive channel ranges of x, each with its own weight
and normalisation, each returned as its own contiguous tensor. A mixer projects q, k and v with one GEMM and
convolves its output in place of three projections and three convs: the backward then produces one input
gradient for one GEMM (separate projections each add a [tokens, dim] gradient to be summed), each segment's
backward writing its channels of it. Channels after the segments (``passthrough``: narrow per-token signals
such as β projected by the same GEMM, and its alignment padding) are returned as they are, as one more
output whose gradient the backward copies into dx: the GEMM's whole input gradient comes from this op, with
no concatenation of the pieces' gradients.

Forward (fwd.py): one kernel per segment, y only (no activation is saved beyond the op's inputs), optionally
L2-normalised per group of channels (a head's query or key), which saves the model a normalisation pass
over the activations each way. Backward (bwd.py): one kernel per segment walks rows, recomputes the
pre-activation from x, takes its gradient dpre, and from it dx (the windows of x and dpre carried in
registers from row to row, so dpre never goes to memory) and dw as one fp32 partial sum per (program,
channel, tap), summed over programs afterwards (deterministic, no atomics). Each kernel has its own tiling
(``Tiling``); layout and tap masks are described in tiles.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from titan_delta_kernels._checks import check_same_device, check_tensor
from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.short_conv.bwd import short_conv_bwd_kernel
from titan_delta_kernels.short_conv.fwd import short_conv_fwd_kernel

Tensor = torch.Tensor

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_KERNEL_SIZE = 8  # taps are unrolled at compile time
MAX_L2_GROUP = 256  # a normalised group is one tile's channels


@dataclass(frozen=True)
class Tiling:
    """A kernel's launch geometry: tiles of ``rows`` × ``channels``, ``tiles`` consecutive row tiles per
    program (the backward kernel writes one dw partial per program, so programs of many rows keep the partials
    [B·T / (rows · tiles), C, K] small), ``num_warps`` warps."""

    rows: int
    channels: int
    tiles: int
    num_warps: int


# Forward: 32 rows × 64 channels on 4 warps, 16 values per thread in 16-byte vectors; with normalisation a
# tile spans one group (a head) to take its norm, with the values per tile of the tiling it derives from:
# 16 × 128 for 128-wide heads. Backward: one row at a time on one warp, 128 rows per program, over 128
# channels or one normalised group (the fastest of the geometries timed at the 340M shapes,
# docs/benchmarks.md, "Short causal conv").
FORWARD_TILING = Tiling(rows=32, channels=64, tiles=4, num_warps=4)
BACKWARD_TILING = Tiling(rows=1, channels=128, tiles=128, num_warps=1)


def normalized_tiling(tiling: Tiling, l2_group: int) -> Tiling:
    """``tiling``, or with normalisation (``l2_group`` > 0) tiles of one group's channels with as many values
    as ``tiling``'s (at least 8 rows), as many rows per program and the same warps."""
    if not l2_group:
        return tiling
    rows = max(8, tiling.rows * tiling.channels // l2_group)
    tiles = max(1, tiling.rows * tiling.tiles // rows)
    return Tiling(rows=rows, channels=l2_group, tiles=tiles, num_warps=tiling.num_warps)


def backward_tiling(l2_group: int) -> Tiling:
    """The backward kernel's tiling for a segment normalised per ``l2_group`` channels (0: not): rows of one
    group when normalised, so that a row's norm stays within the program's warp."""
    if not l2_group:
        return BACKWARD_TILING
    return Tiling(rows=1, channels=l2_group, tiles=BACKWARD_TILING.tiles, num_warps=BACKWARD_TILING.num_warps)


def _constexprs(K: int, seq_pos: Tensor | None, tiling: Tiling) -> dict:
    """The forward kernel's launch keywords: filter width, tile geometry, whether documents are given, and
    the padded tap count of its weight tile."""
    return dict(K=K, HAS_SEQ_POS=seq_pos is not None, BLOCK_T=tiling.rows, BLOCK_C=tiling.channels,
                TILES=tiling.tiles, num_warps=tiling.num_warps, BLOCK_K=next_power_of_2(K))  # fmt: skip


def _grid(rows: int, channels: int, tiling: Tiling) -> tuple[int, int]:
    return cdiv(rows, tiling.rows * tiling.tiles), cdiv(channels, tiling.channels)


def _empty(shape, like: Tensor, dtype: torch.dtype) -> Tensor:
    """torch.empty, NaN-filled under TITAN_DELTA_POISON=1 (tests) so that unwritten elements show."""
    out = torch.empty(shape, device=like.device, dtype=dtype)
    return out.fill_(float("nan")) if os.environ.get("TITAN_DELTA_POISON") == "1" else out


def _seq_pos_or(x: Tensor, seq_pos: Tensor | None) -> Tensor:
    """seq_pos as the kernels index it (contiguous), or x as an unread stand-in when None."""
    return x if seq_pos is None else seq_pos.contiguous()


def _rows(x: Tensor) -> tuple[Tensor, int]:
    """(x, its row stride): x [B, T, C] as the kernels read it, with unit channel stride and its B·T rows
    evenly spaced, possibly wider than C (inductor pads a GEMM output's rows to a multiple of 128 bytes: 3,600
    bf16 columns in rows of 3,648); anything else as a contiguous copy."""
    B, T, width = x.shape
    row_stride = x.stride(1) if T > 1 else x.stride(0) if B > 1 else width
    evenly_spaced = (B == 1 or x.stride(0) == T * row_stride) and (T == 1 or x.stride(1) == row_stride)
    if x.stride(2) == 1 and row_stride >= width and evenly_spaced:
        return x, row_stride
    return x.contiguous(), width


def _segments(weights: list[Tensor], l2_groups: list[int]) -> list[tuple[int, Tensor, int]]:
    """(first channel in x, contiguous weight, l2_group) of each segment."""
    offsets = [0]
    for weight in weights[:-1]:
        offsets.append(offsets[-1] + weight.shape[0])
    return [(o, w.contiguous(), g) for o, w, g in zip(offsets, weights, l2_groups, strict=True)]


# The ops take x with padded rows as it is (``_rows``); without the tag inductor would copy such an input
# to the contiguous strides the op was traced with (custom ops default to exact strides).
_LAYOUT = (torch.Tag.needs_fixed_stride_order,)


@torch.library.custom_op("titan_delta::short_conv_fwd", mutates_args=(), tags=_LAYOUT)
def short_conv_fwd(
    x: Tensor, weights: list[Tensor], seq_pos: Tensor | None, activation: bool, l2_groups: list[int],
    passthrough: int,
) -> list[Tensor]:  # fmt: skip
    """[y_i [B, T, C_i] (contiguous, x's dtype)] and, with ``passthrough`` > 0, x's last ``passthrough``
    channels (a contiguous copy) from x [B, T, ΣC_i + passthrough], weights [C_i, 1, K], seq_pos [B, T] or
    None: segment i convolves channels ΣC_<i .. ΣC_≤i of x."""
    B, T, width = x.shape
    x, x_stride = _rows(x)
    outputs = []
    for offset, weight, l2_group in _segments(weights, l2_groups):
        C = weight.shape[0]
        y = _empty((B, T, C), x, x.dtype)
        outputs.append(y)
        if y.numel() == 0:
            continue
        tiling = normalized_tiling(FORWARD_TILING, l2_group)
        launch(short_conv_fwd_kernel, _grid(B * T, C, tiling), x[..., offset:], weight,
               _seq_pos_or(x, seq_pos), y, T, C, B * T, x_stride, ACTIVATION=activation, NORM=bool(l2_group),
               **_constexprs(weight.shape[-1], seq_pos, tiling))  # fmt: skip
    if passthrough:
        outputs.append(x[..., width - passthrough :].contiguous())
    return outputs


@short_conv_fwd.register_fake
def _(x, weights, seq_pos, activation, l2_groups, passthrough):
    widths = [weight.shape[0] for weight in weights] + ([passthrough] if passthrough else [])
    return [x.new_empty(*x.shape[:2], width) for width in widths]


@torch.library.custom_op("titan_delta::short_conv_bwd", mutates_args=(), tags=_LAYOUT)
def short_conv_bwd(
    dys: list[Tensor], x: Tensor, weights: list[Tensor], seq_pos: Tensor | None, activation: bool,
    l2_groups: list[int],
) -> list[Tensor]:  # fmt: skip
    """[dx (contiguous, x's dtype and shape), dw_i (each weight's dtype and shape)] from the gradients dys of
    the forward's outputs (the segments', then the passthrough channels' if any) and its inputs."""
    B, T, width = x.shape
    K = weights[0].shape[-1]
    dx = _empty(x.shape, x, x.dtype)
    if dx.numel() == 0:
        return [dx, *(weight.new_zeros(weight.shape) for weight in weights)]
    if len(dys) > len(weights):
        passthrough = dys[-1].shape[-1]
        dx[..., width - passthrough :].copy_(dys[-1])
    (x, x_stride), seq_pos_or_x = _rows(x), _seq_pos_or(x, seq_pos)
    dws = []
    segments = _segments(weights, l2_groups)
    for (offset, weight, l2_group), dy in zip(segments, dys[: len(weights)], strict=True):
        C = weight.shape[0]
        tiling = backward_tiling(l2_group)
        grid = _grid(B * T, C, tiling)
        partial = _empty((grid[0], C, K), x, torch.float32)
        launch(short_conv_bwd_kernel, grid, x[..., offset:], weight, seq_pos_or_x, dy.contiguous(),
               dx[..., offset:], partial, T, C, B * T, x_stride, width, K=K, HAS_SEQ_POS=seq_pos is not None,
               ACTIVATION=activation, NORM=bool(l2_group), ROWS=tiling.rows * tiling.tiles,
               BLOCK_C=tiling.channels, num_warps=tiling.num_warps)  # fmt: skip
        dws.append(partial.sum(0).view(weight.shape).to(weight.dtype))
    return [dx, *dws]


@short_conv_bwd.register_fake
def _(dys, x, weights, seq_pos, activation, l2_groups):
    return [x.new_empty(x.shape), *(weight.new_empty(weight.shape) for weight in weights)]


def _setup_context(ctx, inputs, output) -> None:
    x, weights, seq_pos, activation, l2_groups, _ = inputs
    ctx.save_for_backward(x, seq_pos, *weights)
    ctx.activation, ctx.l2_groups = activation, l2_groups


def _backward(ctx, dys):
    x, seq_pos, *weights = ctx.saved_tensors
    dx, *dws = short_conv_bwd(list(dys), x, weights, seq_pos, ctx.activation, ctx.l2_groups)
    return dx, dws, None, None, None, None


torch.library.register_autograd("titan_delta::short_conv_fwd", _backward, setup_context=_setup_context)


def check_l2_group(l2_group: int, channels: int) -> None:
    """ValueError unless ``l2_group`` is 0 (no normalisation) or a power of two ≤ MAX_L2_GROUP dividing
    ``channels``."""
    power_of_two = l2_group > 0 and l2_group & (l2_group - 1) == 0
    if l2_group and not (power_of_two and l2_group <= MAX_L2_GROUP and channels % l2_group == 0):
        raise ValueError(f"l2_group must be 0 or a power of two <= {MAX_L2_GROUP} dividing the {channels} "
                         f"channels, got {l2_group}")  # fmt: skip


def short_causal_conv(
    x: Tensor, weight: Tensor, seq_pos: Tensor | None = None, activation: bool = True, l2_group: int = 0
) -> Tensor:
    """y_t = act(Σ_{j<K} weight[:, 0, K−1−j] · x_{t−j}) with taps before the document start read as zero,
    then, with ``l2_group`` = G > 0, each group of G consecutive channels divided by max(its L2 norm, 1e-12)
    (F.normalize per head).

    x [B, T, C] fp32/bf16/fp16 (any strides; copied when not contiguous, though inside compiled graphs rows
    padded by inductor are read in place); weight [C, 1, K] with K ≤ 8 (the taps are rounded to x's dtype,
    products accumulate in fp32, y is rounded to x's dtype once, after the normalisation); ``seq_pos`` [B, T]
    (or broadcastable to it) integer position of each token inside its document, None when every row is one
    document; act = SiLU when ``activation`` else identity; G a power of two ≤ 256 dividing C.
    Differentiable in x and weight (dw in weight's dtype). Runs on CUDA tensors, and on CPU tensors under
    ``TRITON_INTERPRET=1`` (tests).
    """
    return short_causal_conv_split(x, [weight], seq_pos, activation, [l2_group])[0]


def short_causal_conv_split(
    x: Tensor, weights: list[Tensor], seq_pos: Tensor | None = None, activation: bool = True,
    l2_groups: list[int] | None = None, passthrough: int = 0,
) -> tuple[Tensor, ...]:  # fmt: skip
    """``short_causal_conv`` of consecutive channel ranges of x, each with its own weight and normalisation
    in one op: x [B, T, ΣC_i + passthrough], weights [C_i, 1, K] (one K), ``l2_groups`` one per weight
    (None: no normalisation); returns (y_i [B, T, C_i], contiguous), then, with ``passthrough`` > 0, x's last
    ``passthrough`` channels unchanged (a contiguous copy). dx is one gradient of x's shape."""
    check_tensor("x", x, 3, "[B, T, C]", dtypes=KERNEL_DTYPES)
    if not weights:
        raise ValueError("weights must hold at least one [C, 1, K] weight")
    l2_groups = [0] * len(weights) if l2_groups is None else [int(g) for g in l2_groups]
    if len(l2_groups) != len(weights):
        raise ValueError(f"l2_groups must have one entry per weight ({len(weights)}), got {len(l2_groups)}")
    B, T, width = x.shape
    K = weights[0].shape[-1]
    channels = [weight.shape[0] for weight in weights]
    passthrough = int(passthrough)
    if not 0 <= passthrough < width:
        raise ValueError(f"passthrough must be in [0, {width}) (x's channels), got {passthrough}")
    for i, weight in enumerate(weights):
        name = "weight" if len(weights) == 1 else f"weights[{i}]"
        check_tensor(name, weight, 3, "[C, 1, K]", dtypes=KERNEL_DTYPES)
        if weight.shape[1] != 1 or weight.shape[-1] != K or not 1 <= K <= MAX_KERNEL_SIZE:
            raise ValueError(f"{name} must have shape [C, 1, K] with 1 <= K <= {MAX_KERNEL_SIZE} (one K for "
                             f"every weight), got {tuple(weight.shape)}")  # fmt: skip
    if sum(channels) + passthrough != width:
        convolved = width - passthrough
        expected = (f"[{convolved}, 1, K]" if len(weights) == 1
                    else f"[C_i, 1, K] with C_i adding up to {convolved}")  # fmt: skip
        tail = f" less {passthrough} passthrough" if passthrough else ""
        raise ValueError(f"weight must have shape {expected} (x's channels{tail}), got channels {channels}")
    for group, C in zip(l2_groups, channels, strict=True):
        check_l2_group(group, C)
    if seq_pos is not None:
        check_tensor("seq_pos", seq_pos, 2, "[B, T] (or [1, T])", dtypes=(torch.int32, torch.int64))
        seq_pos = seq_pos.expand(B, T).contiguous()
    check_same_device(x=x, seq_pos=seq_pos, **{f"weights[{i}]": w for i, w in enumerate(weights)})
    x = x.contiguous()
    return tuple(short_conv_fwd(x, list(weights), seq_pos, bool(activation), l2_groups, passthrough))
