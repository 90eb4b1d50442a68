"""Chunk geometry and device-side sequence lookup shared by every Gated DeltaProduct kernel.

Chunks are aligned to tokens: a chunk holds C tokens = C·n_h interleaved steps, so a query row never
straddles two chunks and the output kernels need only C query rows (not C·n_h zero-padded ones).
Sequences (batch rows, or documents packed with ``cu_seqlens``) are split into chunks independently; the
per-chunk kernels find their sequence on the device, so nothing here synchronises with the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_NUM_HOUSEHOLDER = 8
# K: the backward keeps K-wide tiles (in BKS slices) whose shared-memory need above 128 was never verified, so
# the Triton path stops there (callers fall back to the PyTorch reference above it).
MAX_HEAD_DIM = 128
# V: every kernel tiles it (the state passes and the output kernels over the grid, the gradient kernels in
# loops, the 64-step transform in one tile of up to 256 columns), so a wide value head runs as one op and its
# K-side work (T, W, the scores and their gradients) once; the GPU tests cover V up to this.
MAX_VALUE_DIM = 256
# On a GPU the chunked op takes V above this only with K = MAX_HEAD_DIM: with K = 64 and V = 128 or 256 an
# H100 (Triton 3.6) gave wrong outputs from the transposed output kernel and dk off by more than the bf16
# tolerance, while the CPU interpreter's results were right (docs/kernels_gated_delta_product.md, "Known
# limits").
NARROW_KEY_MAX_VALUE_DIM = 64


@dataclass(frozen=True)
class ChunkGeometry:
    """tokens_per_chunk C; block_steps BT ≥ C·n_h and block_tokens BC ≥ C are the Triton block sizes."""

    num_householder: int
    tokens_per_chunk: int
    block_steps: int
    block_tokens: int


def chunk_geometry(num_householder: int) -> ChunkGeometry:
    """C·n_h ≈ 64 steps per chunk (the UT transform is one 64×64 triangle) and C ≥ 16 query rows (tl.dot)."""
    if not 1 <= num_householder <= MAX_NUM_HOUSEHOLDER:
        raise ValueError(
            f"num_householder must be in 1..{MAX_NUM_HOUSEHOLDER} for the Triton kernels, "
            f"got {num_householder}"
        )
    tokens = max(16, 64 // num_householder)
    return ChunkGeometry(
        num_householder=num_householder,
        tokens_per_chunk=tokens,
        block_steps=triton.next_power_of_2(tokens * num_householder),
        block_tokens=triton.next_power_of_2(tokens),
    )


@dataclass(frozen=True)
class SequenceLayout:
    """How the token axis splits into N sequences and those into chunks: ``chunk_offsets[n]`` is sequence n's
    first chunk (on the device), ``grid_chunks`` bounds the chunks from shapes alone (launching never reads
    device values), ``search_steps`` is the number of binary-search rounds from a chunk to its sequence."""

    num_sequences: int
    tokens_per_sequence: int  # T when not varlen (unused for varlen)
    chunks_per_sequence: int  # cdiv(T, C) when not varlen
    grid_chunks: int
    is_varlen: bool
    cu_seqlens: torch.Tensor  # int32 [N+1] (a dummy for non-varlen)
    chunk_offsets: torch.Tensor  # int32 [N+1] (a dummy for non-varlen)
    search_steps: int


def sequence_layout(
    batch: int, tokens: int, cu_seqlens: torch.Tensor | None, geometry: ChunkGeometry, device: torch.device
) -> SequenceLayout:
    C = geometry.tokens_per_chunk
    if cu_seqlens is None:
        per_seq = triton.cdiv(tokens, C)
        dummy = torch.zeros(1, dtype=torch.int32, device=device)
        return SequenceLayout(batch, tokens, per_seq, batch * per_seq, False, dummy, dummy, 0)
    n = cu_seqlens.numel() - 1
    cu = cu_seqlens.to(device=device, dtype=torch.int32)
    lengths = cu[1:] - cu[:-1]
    offsets = torch.zeros(n + 1, dtype=torch.int32, device=device)
    offsets[1:] = torch.cumsum(torch.div(lengths + C - 1, C, rounding_mode="floor"), 0)
    # Each document adds at most one partial chunk beyond ⌈T/C⌉.
    grid = triton.cdiv(tokens, C) + n
    return SequenceLayout(n, tokens, 0, grid, True, cu, offsets, max(1, (n - 1).bit_length()))


@triton.jit
def locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN: tl.constexpr):
    """Chunk index -> (sequence, chunk within it, first token, end token) of the flattened token axis."""
    if IS_VARLEN:
        lo = i_chunk * 0
        hi = lo + N - 1
        for _ in range(search_steps):
            mid = (lo + hi + 1) // 2
            go = tl.load(chunk_offsets + mid) <= i_chunk
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid - 1)
        seq = lo
        bos = tl.load(cu_seqlens + seq)
        eos = tl.load(cu_seqlens + seq + 1)
        i_c = i_chunk - tl.load(chunk_offsets + seq)
    else:
        seq = i_chunk // NT
        i_c = i_chunk % NT
        bos = seq * T
        eos = bos + T
    return seq, i_c, bos, eos


@triton.jit
def sequence_bounds(i_seq, cu_seqlens, chunk_offsets, T, NT, IS_VARLEN: tl.constexpr):
    """Sequence index -> (first token, end token, index of its first chunk)."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_seq)
        eos = tl.load(cu_seqlens + i_seq + 1)
        first_chunk = tl.load(chunk_offsets + i_seq)
    else:
        bos = i_seq * T
        eos = bos + T
        first_chunk = i_seq * NT
    return bos, eos, first_chunk


@triton.jit
def chunk_log_gates(
    g, tok0, n_tok, i_h, H, NH: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, USE_G: tl.constexpr
):
    """Within-chunk cumulative log gates at steps [BT] and at query tokens [BC], and the chunk total.

    The gate of token t acts at its first step; every exponent the kernels take is a difference of two of
    these (≤ 0 for g ≤ 0): no exp-then-divide. Steps copy their token's prefix sum (not re-summed), so steps
    of one token, its query and the chunk total agree bitwise: their differences are exact zeros at any |G|.
    Padding steps take the chunk total (zero gates up to BC tokens, then clamped to the last token), so a
    padding row meets e^{G_r − G_j} ≤ 1 (with 0 there, e^{+480} overflowed at g ~ −30 and 0·inf made NaN).
    """
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    if USE_G:
        g_tok = tl.load(g + (tok0 + o_t).to(tl.int64) * H + i_h, mask=o_t < n_tok, other=0.0).to(tl.float32)
        Gq = tl.cumsum(g_tok, 0)
        G = tl.sum(tl.where(tl.minimum(o_s // NH, BC - 1)[:, None] == o_t[None, :], Gq[None, :], 0.0), 1)
        G_last = tl.sum(tl.where(o_t == n_tok - 1, Gq, 0.0), 0)
    else:
        G = tl.zeros([BT], dtype=tl.float32)
        Gq = tl.zeros([BC], dtype=tl.float32)
        G_last = tl.sum(Gq, 0)
    return G, Gq, G_last


# Scaled fp16 operands (W, U; the state in W·S at K = 128; dδ in Wᵀ·dδ): fp16 has tf32's 11 bits at half the
# bytes, but not fp32's range. A power of two per row or column puts its largest entry in [2^14, 2^15) and is
# undone exactly after the product; entries 2^28 below their row's largest go subnormal (error < 2^-25 of it).
F16_TOP = tl.constexpr(16384.0)  # 2^14
F16_FLOOR = tl.constexpr(2.0**-100)  # a row whose largest entry is below this (or zero) keeps this scale


@triton.jit
def pow2_below(x):
    """2^floor(log2 x) for x > 0, read from x's exponent bits (exact), never below F16_FLOOR."""
    p = (x.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    return tl.maximum(p, F16_FLOOR)


@triton.jit
def scaled_f16(x, AXIS: tl.constexpr):
    """(x scaled to fp16, the factor that undoes it), one power-of-two scale per slice along AXIS: AXIS=1
    scales rows (the first operand of a product), AXIS=0 columns (the second). The factor has x's other
    dim."""
    p = pow2_below(tl.max(tl.abs(x), axis=AXIS))
    # up = 2^14 / p, exact for a power of two p: biased exponent 268 − e for p's e in [27, 254] (p ≥ 2^-100),
    # built from p's bits instead of a division (a full-precision divide: reciprocal, fix-ups, branches).
    up = (0x46800000 - (p.to(tl.int32, bitcast=True) - 0x3F800000)).to(tl.float32, bitcast=True)
    x16 = (x * up[None, :]).to(tl.float16) if AXIS == 0 else (x * up[:, None]).to(tl.float16)
    return x16, p * (1.0 / F16_TOP)


def row_scaled_f16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch twin of ``scaled_f16(x, 1)`` over the last dim: (x·2^s in fp16, 2^-s in fp32), one power of two
    per row, bitwise what the kernels compute. For W and U of the 128-step transform, which writes fp32."""
    x = x.float()
    amax = x.abs().amax(-1)
    p = (amax.view(torch.int32) & 0x7F800000).view(torch.float32).clamp_min(2.0**-100)
    up = 1.0 / p * 16384.0
    return (x * up[..., None]).to(torch.float16), p * (1.0 / 16384.0)
