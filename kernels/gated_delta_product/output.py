"""Per-chunk outputs and their local value gradient, with C query rows per chunk (one per token).

o_i = scale·(e^{Gq_i} q_iᵀ S₀ + Σ_{r ≤ last step of token i} e^{Gq_i − G_r} (q_iᵀ k_r) δ_r): the score
matrix is C × C·n_h (FLA runs the same product over all C·n_h steps with zero queries).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, next_power_of_2
from titan_delta_kernels.gated_delta_product._common import (
    ChunkGeometry,
    SequenceLayout,
    chunk_log_gates,
    locate_chunk,
)
from titan_delta_kernels.gated_delta_product.launch_table import GdpLaunch, launch_stage


@triton.jit
def output_fwd_kernel(
    q, k, g, v_new, chunk_states, o,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_chunk, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    rows = (tok0.to(tl.int64) * NH + o_s) * H + i_h
    q_rows = (tok0.to(tl.int64) + o_t) * H + i_h
    if IS_VARLEN:  # noqa: SIM108 (a constexpr branch, not a runtime select)
        chunk_id = i_c + tl.load(chunk_offsets + seq)
    else:
        chunk_id = i_chunk
    h_off = ((chunk_id.to(tl.int64) * H + i_h) * K + o_k[:, None]) * V + o_v[None, :]

    # K in BK-column slices (the launcher passes all of K): q S₀ and the scores q kᵀ accumulate over them.
    b_qh = tl.zeros([BC, BV], dtype=tl.float32)
    b_qk = tl.zeros([BC, BT], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(q + q_rows[:, None] * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_s[None, :], other=0.0)
        b_h = tl.load(chunk_states + h_off + i_k * BK * V, mask=m_k[:, None] & (o_v < V)[None, :], other=0.0)
        b_qh += tl.dot(b_q, b_h.to(b_q.dtype), input_precision=PREC)
        b_qk += tl.dot(b_q, b_kt, input_precision=PREC)
    b_d = tl.load(v_new + rows[:, None] * V + o_v[None, :], mask=m_s[:, None] & (o_v < V)[None, :], other=0.0)
    G, Gq, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)

    # Decayed causal scores e^{Gq_i − G_r}(q_i·k_r), zero where step r comes after token i.
    causal = ((o_s // NH)[None, :] <= o_t[:, None]) & (o_t < n_tok)[:, None]
    b_s = b_qk * tl.exp(tl.where(causal, Gq[:, None] - G[None, :], float("-inf")))
    # Scores meet δ in δ's dtype (the input dtype).
    b_o = b_qh * tl.exp(Gq)[:, None] + tl.dot(b_s.to(b_d.dtype), b_d, input_precision=PREC)
    tl.store(o + q_rows[:, None] * V + o_v[None, :], (b_o * scale).to(o.dtype.element_ty),
             mask=m_t[:, None] & (o_v < V)[None, :])  # fmt: skip


@triton.jit
def output_fwd_t_kernel(
    q, k, g, v_new, chunk_states, o,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``output_fwd_kernel`` transposed, oᵀ = e^{Gq}·Sᵀqᵀ + δᵀ·scoresᵀ: every product has V columns or steps
    (≥ 64) as rows, so all are warp-group MMAs (the direct form's C ≤ 32 query rows fall back to mma.sync)."""
    i_chunk, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    m_k = o_k < K
    m_v = o_v < V
    rows = (tok0.to(tl.int64) * NH + o_s) * H + i_h
    q_rows = (tok0.to(tl.int64) + o_t) * H + i_h
    if IS_VARLEN:  # noqa: SIM108 (a constexpr branch, not a runtime select)
        chunk_id = i_c + tl.load(chunk_offsets + seq)
    else:
        chunk_id = i_chunk
    h_base = (chunk_id.to(tl.int64) * H + i_h) * K * V
    b_qt = tl.load(q + q_rows[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
    b_ht = tl.load(chunk_states + h_base + o_k[None, :] * V + o_v[:, None], mask=m_v[:, None] & m_k[None, :],
                   other=0.0)  # fmt: skip
    if USE_G:
        b_oqt = tl.dot(b_ht.to(b_qt.dtype), b_qt, input_precision=PREC)
    b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
    G, Gq, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    causal_t = ((o_s // NH)[:, None] <= o_t[None, :]) & m_t[None, :]
    decay_t = tl.exp(tl.where(causal_t, Gq[None, :] - G[:, None], float("-inf")))
    b_st = tl.dot(b_k, b_qt, input_precision=PREC) * decay_t
    b_dt = tl.load(v_new + rows[None, :] * V + o_v[:, None], mask=m_v[:, None] & m_s[None, :], other=0.0)
    # Scores meet δ in δ's dtype, as in output_fwd_kernel.
    if USE_G:
        b_ot = b_oqt * tl.exp(Gq)[None, :] + tl.dot(b_dt, b_st.to(b_dt.dtype), input_precision=PREC)
    else:
        # Without the gate factor Triton would make Sᵀqᵀ (Sᵀ read transposed from memory) the accumulator of
        # δᵀ·scoresᵀ: with 16-bit states that chain gave wrong o on an H100-class GPU (Triton 3.6); the
        # reverse chain below is right.
        b_ot = tl.dot(b_ht.to(b_qt.dtype), b_qt, acc=tl.dot(b_dt, b_st.to(b_dt.dtype), input_precision=PREC),
                      input_precision=PREC)
    tl.store(o + q_rows[None, :] * V + o_v[:, None], (b_ot * scale).to(o.dtype.element_ty),
             mask=m_v[:, None] & m_t[None, :])  # fmt: skip


@triton.jit
def dv_local_kernel(
    q, k, g, d_out, d_vlocal,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """∂L/∂δ from this chunk's own outputs: scale·scoresᵀ dO (the reverse pass adds the state part)."""
    i_chunk, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    rows = (tok0.to(tl.int64) * NH + o_s) * H + i_h
    q_rows = (tok0.to(tl.int64) + o_t) * H + i_h

    b_qt = tl.load(q + q_rows[None, :] * K + o_k[:, None], mask=(o_k < K)[:, None] & m_t[None, :], other=0.0)
    b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & (o_k < K)[None, :], other=0.0)
    b_do = tl.load(d_out + q_rows[:, None] * V + o_v[None, :], mask=m_t[:, None] & (o_v < V)[None, :],
                   other=0.0)  # fmt: skip
    G, Gq, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    # Scores built transposed ([steps, queries]) rather than transposing a dot result.
    causal_t = ((o_s // NH)[:, None] <= o_t[None, :]) & m_t[None, :]
    decay_t = tl.exp(tl.where(causal_t, Gq[None, :] - G[:, None], float("-inf")))
    b_st = tl.dot(b_k, b_qt, input_precision=PREC) * decay_t * scale
    b_dv = tl.dot(b_st.to(b_k.dtype), b_do.to(b_k.dtype), input_precision=PREC)
    tl.store(d_vlocal + rows[:, None] * V + o_v[None, :], b_dv.to(d_vlocal.dtype.element_ty),
             mask=m_s[:, None] & (o_v < V)[None, :])  # fmt: skip


def output_fwd(q: torch.Tensor, k: torch.Tensor, g: torch.Tensor | None, v_new: torch.Tensor,
               chunk_states: torch.Tensor, scale: float, geo: ChunkGeometry, seqs: SequenceLayout,
               cfg: GdpLaunch) -> torch.Tensor:  # fmt: skip
    """o [B, T, H, V] in q's dtype, by the transposed or the direct kernel as the launch table says."""
    o = q.new_empty(*q.shape[:3], v_new.shape[-1])
    kernel = output_fwd_t_kernel if cfg.output_transposed else output_fwd_kernel
    _launch(kernel, (q, k, k if g is None else g, v_new, chunk_states, o), q, scale, g, geo, seqs, cfg)
    return o


def dv_local(q: torch.Tensor, k: torch.Tensor, g: torch.Tensor | None, d_out: torch.Tensor, scale: float,
             geo: ChunkGeometry, seqs: SequenceLayout, cfg: GdpLaunch) -> torch.Tensor:  # fmt: skip
    """[B, L, H, V] in k's dtype: the within-chunk part of ∂L/∂δ (the reverse state pass adds the rest)."""
    d_vlocal = torch.empty(*k.shape[:3], d_out.shape[-1], dtype=k.dtype, device=k.device)
    _launch(dv_local_kernel, (q, k, k if g is None else g, d_out, d_vlocal), q, scale, g, geo, seqs, cfg)
    return d_vlocal


def _launch(kernel, tensors: tuple, q: torch.Tensor, scale: float, g: torch.Tensor | None, geo: ChunkGeometry,
            seqs: SequenceLayout, cfg: GdpLaunch) -> None:  # fmt: skip
    """One program per (chunk, head, V tile), all of K in one slice (V is that of the last tensor)."""
    _, _, H, K = q.shape
    V, BV = tensors[-1].shape[-1], cfg.output_block_v
    launch_stage(kernel, (seqs.grid_chunks, H, cdiv(V, BV)), tensors, geo, seqs, (H, K, V), g, tail=(scale,),
                 BK=max(16, next_power_of_2(K)), BV=BV, PREC=cfg.dot_precision,
                 num_warps=cfg.output_warps)  # fmt: skip
