"""The two sequential passes over chunks: forward states and reverse state gradients (general kernels).

One program per (sequence, head, V tile) walks its sequence's chunks, carrying the [K, BV] fp32 state (V
columns of the state are independent, so tiling V is exact); the heavy per-chunk work runs in the parallel
kernels. The launchers take the short-loop kernels of ``state_lean.py`` where the launch table says so.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, next_power_of_2
from titan_delta_kernels.gated_delta_product._common import (
    ChunkGeometry,
    SequenceLayout,
    chunk_log_gates,
    sequence_bounds,
)
from titan_delta_kernels.gated_delta_product.launch_table import GdpLaunch, launch_stage
from titan_delta_kernels.gated_delta_product.state_lean import state_bwd_lean_kernel, state_fwd_lean_kernel


@triton.jit
def state_fwd_kernel(
    k, w, u, w_scale, u_scale, g, h0, chunk_states, v_new, final_state,
    cu_seqlens, chunk_offsets, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr, ROW_SCALED: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """Stores the state entering each chunk and δ = U − W S for it; writes the final state. ``ROW_SCALED``
    (16-bit inputs): W and U in fp16 with a power-of-two scale per row; W is widened to fp32 for a tf32
    product (exact: fp16 has tf32's 11 bits), whose rows are unscaled in δ's subtraction."""
    i_seq, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk = sequence_bounds(i_seq, cu_seqlens, chunk_offsets, T, NT, IS_VARLEN)
    o_s = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    state_off = ((i_seq * H + i_h) * K + o_k[:, None]).to(tl.int64) * V + o_v[None, :]
    if USE_H0:
        b_h = tl.load(h0 + state_off, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    n_chunks = tl.cdiv(eos - bos, C)
    for i_c in range(0, n_chunks):
        tok0 = bos + i_c * C
        n_tok = tl.minimum(C, eos - tok0)
        m_s = o_s < n_tok * NH
        rows = (tok0.to(tl.int64) * NH + o_s) * H + i_h
        h_off = (((first_chunk + i_c).to(tl.int64) * H + i_h) * K + o_k[:, None]) * V + o_v[None, :]
        tl.store(chunk_states + h_off, b_h.to(chunk_states.dtype.element_ty), mask=m_kv)

        m_sk = m_s[:, None] & (o_k < K)[None, :]
        m_sv = m_s[:, None] & (o_v < V)[None, :]
        b_u = tl.load(u + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0).to(tl.float32)
        if ROW_SCALED:
            b_u = b_u * tl.load(u_scale + rows, mask=m_s, other=0.0)[:, None]
            w_unscale = tl.load(w_scale + rows, mask=m_s, other=0.0)
        b_w = tl.load(w + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
        if ROW_SCALED:
            b_w = b_w.to(tl.float32)
            b_delta = b_u - tl.dot(b_w, b_h, input_precision=PREC) * w_unscale[:, None]
        else:
            b_delta = b_u - tl.dot(b_w, b_h.to(b_w.dtype), input_precision=PREC)
        tl.store(v_new + rows[:, None] * V + o_v[None, :], b_delta.to(v_new.dtype.element_ty), mask=m_sv)

        G, _, G_last = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
        m_ks = (o_k < K)[:, None] & m_s[None, :]
        b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
        b_delta = b_delta * tl.exp(G_last - G)[:, None]
        b_h = b_h * tl.exp(G_last) + tl.dot(b_kt.to(b_w.dtype), b_delta.to(b_w.dtype), input_precision=PREC)
    tl.store(final_state + state_off, b_h, mask=m_kv)


@triton.jit
def state_bwd_kernel(
    q, k, w, w_scale, g, d_out, d_final, d_vlocal, d_chunk_states, d_delta, d_h0,
    cu_seqlens, chunk_offsets, T, NT, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_DHT: tl.constexpr, IS_VARLEN: tl.constexpr, SPLIT_DTYPE: tl.constexpr,
    ROW_SCALED: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Reverse pass: stores ∂L/∂(state leaving each chunk) and the total ∂L/∂δ; writes ∂L/∂initial_state.
    ``ROW_SCALED`` (16-bit inputs): W, rebuilt in fp32 from fp16 and its row scales, meets dδ in three
    SPLIT_DTYPE (bf16) products hi·hi + hi·lo + lo·hi (~2^-16 relative): a tf32 product would need fp32 Wᵀ
    steps-contiguous in shared memory, which the pipeliner copies with 4-byte transfers."""
    i_seq, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk = sequence_bounds(i_seq, cu_seqlens, chunk_offsets, T, NT, IS_VARLEN)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    state_off = ((i_seq * H + i_h) * K + o_k[:, None]).to(tl.int64) * V + o_v[None, :]
    if USE_DHT:
        b_dh = tl.load(d_final + state_off, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    n_chunks = tl.cdiv(eos - bos, C)
    for i_rev in range(0, n_chunks):
        i_c = n_chunks - 1 - i_rev
        tok0 = bos + i_c * C
        n_tok = tl.minimum(C, eos - tok0)
        m_s = o_s < n_tok * NH
        m_t = o_t < n_tok
        rows = (tok0.to(tl.int64) * NH + o_s) * H + i_h
        q_rows = (tok0.to(tl.int64) + o_t) * H + i_h
        h_off = (((first_chunk + i_c).to(tl.int64) * H + i_h) * K + o_k[:, None]) * V + o_v[None, :]
        tl.store(d_chunk_states + h_off, b_dh.to(d_chunk_states.dtype.element_ty), mask=m_kv)

        G, Gq, G_last = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
        m_sk = m_s[:, None] & (o_k < K)[None, :]
        m_sv = m_s[:, None] & (o_v < V)[None, :]
        b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
        b_dd = tl.load(d_vlocal + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0).to(tl.float32)
        b_dd += tl.dot(b_k, b_dh.to(b_k.dtype), input_precision=PREC) * tl.exp(G_last - G)[:, None]
        tl.store(d_delta + rows[:, None] * V + o_v[None, :], b_dd.to(d_delta.dtype.element_ty), mask=m_sv)

        m_kt = (o_k < K)[:, None] & m_t[None, :]
        b_qt = tl.load(q + q_rows[None, :] * K + o_k[:, None], mask=m_kt, other=0.0)
        b_do = tl.load(d_out + q_rows[:, None] * V + o_v[None, :], mask=m_t[:, None] & (o_v < V)[None, :],
                       other=0.0)  # fmt: skip
        b_do = (b_do.to(tl.float32) * (scale * tl.exp(Gq))[:, None]).to(b_qt.dtype)
        m_ks = (o_k < K)[:, None] & m_s[None, :]
        b_wt = tl.load(w + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
        if ROW_SCALED:
            b_wt = b_wt.to(tl.float32) * tl.load(w_scale + rows, mask=m_s, other=0.0)[None, :]
            w_hi = b_wt.to(SPLIT_DTYPE)
            w_lo = (b_wt.to(tl.float32) - w_hi.to(tl.float32)).to(SPLIT_DTYPE)  # the difference is exact
            d_hi = b_dd.to(SPLIT_DTYPE)
            d_lo = (b_dd - d_hi.to(tl.float32)).to(SPLIT_DTYPE)
            b_wdd = tl.dot(w_lo, d_hi, tl.dot(w_hi, d_lo, tl.dot(w_hi, d_hi)))
        else:
            b_wdd = tl.dot(b_wt, b_dd.to(b_wt.dtype), input_precision=PREC)
        b_dh = b_dh * tl.exp(G_last) + tl.dot(b_qt, b_do, input_precision=PREC) - b_wdd
    tl.store(d_h0 + state_off, b_dh, mask=m_kv)


def _split_dtype() -> tl.dtype:
    """bf16 for the three-product Wᵀ·dδ; fp16 under the CPU interpreter, whose bf16 tl.dot returns garbage
    and whose fp32 -> bf16 cast does not round to nearest (there the tests check the split's algebra)."""
    return tl.float16 if os.environ.get("TRITON_INTERPRET") == "1" else tl.bfloat16


def state_fwd(
    k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, w_scale: torch.Tensor | None,
    u_scale: torch.Tensor | None, g: torch.Tensor | None, initial_state: torch.Tensor | None,
    geo: ChunkGeometry, seqs: SequenceLayout, cfg: GdpLaunch,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Returns (chunk-start states [chunks,H,K,V] in k's dtype, δ in k's dtype, final state [N,H,K,V] fp32).
    ``w_scale`` / ``u_scale``: W's and U's row scales (16-bit inputs) or None (fp32 W and U)."""
    _, _, H, K = k.shape
    V = u.shape[-1]
    chunk_states = k.new_empty(seqs.grid_chunks, H, K, V)
    v_new = torch.empty_like(u, dtype=k.dtype)
    final_state = torch.empty(seqs.num_sequences, H, K, V, dtype=torch.float32, device=k.device)
    tensors = (
        k, w, u, k if w_scale is None else w_scale, k if u_scale is None else u_scale, k if g is None else g,
        k if initial_state is None else initial_state, chunk_states, v_new, final_state,
    )  # fmt: skip
    if cfg.state_fwd_lean:
        kernel, options = state_fwd_lean_kernel, dict(S16=cfg.state_fwd_s16)
    else:
        kernel, options = state_fwd_kernel, dict(BK=max(16, next_power_of_2(K)))
    BV = cfg.state_fwd_block_v
    launch_stage(
        kernel, (seqs.num_sequences, H, cdiv(V, BV)), tensors, geo, seqs, (H, K, V), g, sequential=True,
        BV=BV, USE_H0=initial_state is not None, ROW_SCALED=w_scale is not None, PREC=cfg.dot_precision,
        num_stages=cfg.state_fwd_stages, **options,
    )  # fmt: skip
    return chunk_states, v_new, final_state


def state_bwd(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor | None, g: torch.Tensor | None,
    d_out: torch.Tensor, d_final: torch.Tensor | None, d_vlocal: torch.Tensor, scale: float,
    geo: ChunkGeometry, seqs: SequenceLayout, cfg: GdpLaunch,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Returns (∂L/∂chunk-end states [chunks,H,K,V], total ∂L/∂δ in k's dtype (both readers round it to that;
    the pass uses the fp32 value), ∂L/∂S₀ [N,H,K,V] fp32)."""
    _, _, H, K = k.shape
    V = d_vlocal.shape[-1]
    d_chunk_states = k.new_empty(seqs.grid_chunks, H, K, V)
    d_delta = torch.empty_like(d_vlocal, dtype=k.dtype)
    d_h0 = torch.empty(seqs.num_sequences, H, K, V, dtype=torch.float32, device=k.device)
    tensors = (q, k, w, k if w_scale is None else w_scale, k if g is None else g, d_out,
               k if d_final is None else d_final, d_vlocal, d_chunk_states, d_delta, d_h0)  # fmt: skip
    if cfg.state_bwd_lean:
        kernel, options = state_bwd_lean_kernel, {}
    else:
        kernel, options = state_bwd_kernel, dict(BK=max(16, next_power_of_2(K)), SPLIT_DTYPE=_split_dtype(),
                                                 ROW_SCALED=w_scale is not None, PREC=cfg.dot_precision)
    BV = cfg.state_bwd_block_v
    launch_stage(
        kernel, (seqs.num_sequences, H, cdiv(V, BV)), tensors, geo, seqs, (H, K, V), g, tail=(scale,),
        sequential=True, BV=BV, USE_DHT=d_final is not None, num_stages=cfg.state_bwd_stages, **options,
    )  # fmt: skip
    return d_chunk_states, d_delta, d_h0
