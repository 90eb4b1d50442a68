"""Flag ``gpre``: the within-chunk log-gate prefix sums computed once per chunk, for the two state passes.

Why: ``_common.chunk_log_gates`` (a gate load, a scan over the chunk's tokens and a [BT, BC] reduction that
copies token sums to steps) runs inside every iteration of the sequential state passes, between the
products of one chunk. The per-chunk kernels can afford it (other programs hide it); a pass that walks 128
to 196 chunks in order pays its latency at every step. Here one parallel launch stores G per step, and the
passes load it: a [BT] vector, prefetched with their other loads. The stored values are
``chunk_log_gates``' own (same kernel code), so every exponent the passes take is bitwise unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import launch
from titan_delta_kernels.gated_delta_product._common import (
    ChunkGeometry,
    SequenceLayout,
    chunk_log_gates,
    locate_chunk,
)


@triton.jit
def chunk_gates_kernel(
    g, g_step, cu_seqlens, chunk_offsets, T, NT, N, search_steps,
    H: tl.constexpr, NH: tl.constexpr, C: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """G [BT] of one (chunk, head), as ``chunk_log_gates`` computes it, stored per step."""
    i_chunk, i_h = tl.program_id(0), tl.program_id(1)
    _seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    o_s = tl.arange(0, BT)
    G, _, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, True)
    tl.store(g_step + (tok0.to(tl.int64) * NH + o_s) * H + i_h, G, mask=o_s < n_tok * NH)


@triton.jit
def stored_log_gates(g_step, tok0, n_tok, i_h, H, NH: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """``chunk_log_gates``' (G [BT], Gq [BC], G_last) read back from ``g_step``: a token's prefix sum is the G
    of each of its steps, so Gq is G at every token's first step and G_last G at the chunk's last step. Past
    the chunk's end the values are ``chunk_log_gates``' too: G_last."""
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    step0 = tok0.to(tl.int64) * NH
    m_s = o_s < n_tok * NH
    G_last = tl.load(g_step + (step0 + n_tok * NH - 1) * H + i_h)
    G = tl.load(g_step + (step0 + o_s) * H + i_h, mask=m_s, other=0.0)
    G = tl.where(m_s, G, G_last)
    Gq = tl.load(g_step + (step0 + o_t * NH) * H + i_h, mask=o_t < n_tok, other=0.0)
    Gq = tl.where(o_t < n_tok, Gq, G_last)
    return G, Gq, G_last


def chunk_gate_prefix(g: torch.Tensor, geo: ChunkGeometry, seqs: SequenceLayout, steps: int) -> torch.Tensor:
    """[B, T·n_h, H] fp32: each step's within-chunk cumulative log gate (``steps`` = T·n_h)."""
    B, _, H = g.shape
    g_step = torch.empty(B, steps, H, dtype=torch.float32, device=g.device)
    launch(
        chunk_gates_kernel, (seqs.grid_chunks, H),
        g, g_step, seqs.cu_seqlens, seqs.chunk_offsets, seqs.tokens_per_sequence, seqs.chunks_per_sequence,
        seqs.num_sequences, seqs.search_steps,
        H=H, NH=geo.num_householder, C=geo.tokens_per_chunk, BT=geo.block_steps, BC=geo.block_tokens,
        IS_VARLEN=seqs.is_varlen, num_warps=1,
    )  # fmt: skip
    return g_step
