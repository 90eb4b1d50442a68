"""Per-chunk gradients: (1) through the outputs and the state update, (2) through the UT transform.

(1) gives dq (only the C real query rows), the direct part of dk, ∂L/∂W = −dδ S₀ᵀ and the log-gate
gradients of the output/state exponentials; (2) pushes ∂L/∂U = dδ and ∂L/∂W through T = (I + A)⁻¹
(∂L/∂A = −Tᵀ ∂L/∂T Tᵀ) into dk, dv, dβ and the gates, then maps step-level gate gradients to tokens
(a reverse cumulative sum, because each chunk's log gates are a prefix sum of g).

No ``tl.trans`` here: Triton 3.4–3.7.0 miscompiles a transposed dot result used as a dot operand on Hopper
(the bug behind FLA's guard, fla-org/flash-linear-attention#640). Transposed operands are loaded through
transposed pointers, and transposed products are computed as products of transposed operands.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import launch, next_power_of_2
from titan_delta_kernels.gated_delta_product._common import (
    ChunkGeometry,
    SequenceLayout,
    chunk_log_gates,
    locate_chunk,
)
from titan_delta_kernels.gated_delta_product.output import masked_scores

Tensor = torch.Tensor

# Offline sm_90a compiles (Triton 3.9) at K = 64: 4 warps spill 936 B (dqkw) and 1,374 B (wy_bwd) of
# registers, 8 warps 80 B and 104 B. K = 128 ran correct on an H200 with 8 warps.
GRADS_NUM_WARPS = 8


@triton.jit
def dqkw_kernel(
    q, k, g, v_new, chunk_states, d_chunk_states, d_delta, d_out,
    dq, dk_part, dw, dG_step, dG_tok,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    i_chunk, i_h = tl.program_id(0), tl.program_id(1)
    seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    m_k = o_k < K
    rows = (tok0.to(tl.int64) * NH + o_s) * H + i_h
    q_rows = (tok0.to(tl.int64) + o_t) * H + i_h
    if IS_VARLEN:  # noqa: SIM108 (a constexpr branch, not a runtime select)
        chunk_id = i_c + tl.load(chunk_offsets + seq)
    else:
        chunk_id = i_chunk
    h_base = (chunk_id.to(tl.int64) * H + i_h) * K * V

    b_dq = tl.zeros([BC, BK], dtype=tl.float32)
    b_ds = tl.zeros([BC, BT], dtype=tl.float32)
    b_dst = tl.zeros([BT, BC], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    b_dhh = tl.zeros([BV], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_vk = m_v[:, None] & m_k[None, :]
        # States as [BV, BK] (transposed pointers), δ/dδ/dO both ways round: no tl.trans anywhere.
        b_ht = tl.load(chunk_states + h_base + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.0)
        b_dht = tl.load(d_chunk_states + h_base + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.0)
        m_sv = m_s[:, None] & m_v[None, :]
        b_d = tl.load(v_new + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0)
        b_dt = tl.load(v_new + rows[None, :] * V + o_v[:, None], mask=m_v[:, None] & m_s[None, :], other=0.0)
        b_dd = tl.load(d_delta + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0)
        m_tv = m_t[:, None] & m_v[None, :]
        b_d = b_d.to(b_ht.dtype)
        b_do = tl.load(d_out + q_rows[:, None] * V + o_v[None, :], mask=m_tv, other=0.0).to(b_ht.dtype)
        m_vt = m_v[:, None] & m_t[None, :]
        b_dot = tl.load(d_out + q_rows[None, :] * V + o_v[:, None], mask=m_vt, other=0.0)
        b_dq += tl.dot(b_do, b_ht)
        b_ds += tl.dot(b_do, b_dt.to(b_ht.dtype))
        b_dst += tl.dot(b_d, b_dot.to(b_ht.dtype))
        b_dk += tl.dot(b_d, b_dht)
        b_dw += tl.dot(b_dd.to(b_ht.dtype), b_ht)
        b_dhh += tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), 1)

    G, Gq, G_last = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    b_q = tl.load(q + q_rows[:, None] * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
    b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
    b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_s[None, :], other=0.0)
    # Inter-chunk output term scale·e^{Gq} q S₀ and the intra-chunk scores.
    b_dq = b_dq * (scale * tl.exp(Gq))[:, None]
    dGq = tl.sum(b_dq * b_q.to(tl.float32), 1)
    # A pair (query i, step r) moves +p to Gq_i and −p to G_r; when r belongs to token i the two cancel in
    # g exactly, so such pairs are dropped rather than left to cancel in fp32 (gates near 0: dg ≈ 0).
    earlier = (o_s // NH)[None, :] < o_t[:, None]
    b_p = tl.where(earlier, masked_scores(b_q, b_kt, G, Gq, n_tok, NH, BT, BC) * scale * b_ds, 0.0)
    dGq += tl.sum(b_p, 1)
    dG = -tl.sum(b_p, 0)
    causal = ((o_s // NH)[None, :] <= o_t[:, None]) & m_t[:, None]
    b_dsd = tl.where(causal, b_ds * tl.exp(tl.where(causal, Gq[:, None] - G[None, :], 0.0)) * scale, 0.0)
    b_dq += tl.dot(b_dsd.to(b_k.dtype), b_k)
    causal_t = ((o_s // NH)[:, None] <= o_t[None, :]) & m_t[None, :]
    decay_t = tl.exp(tl.where(causal_t, Gq[None, :] - G[:, None], 0.0))
    b_dsd_t = tl.where(causal_t, b_dst * decay_t * scale, 0.0)
    b_dk_o = tl.dot(b_dsd_t.to(b_q.dtype), b_q)
    # State update term e^{G_L − G_r} k_r δ_rᵀ and e^{G_L} S₀.
    b_dk = b_dk * tl.exp(G_last - G)[:, None]
    kdk = tl.where(o_s // NH < n_tok - 1, tl.sum(b_dk * b_k.to(tl.float32), 1), 0.0)  # same cancellation
    dG -= kdk
    dG_last = tl.sum(b_dhh, 0) * tl.exp(G_last) + tl.sum(kdk, 0)
    dGq += tl.where(o_t == n_tok - 1, dG_last, 0.0)

    m_tk = m_t[:, None] & m_k[None, :]
    tl.store(dq + q_rows[:, None] * K + o_k[None, :], b_dq.to(dq.dtype.element_ty), mask=m_tk)
    m_sk = m_s[:, None] & m_k[None, :]
    b_dk += b_dk_o
    tl.store(dk_part + rows[:, None] * K + o_k[None, :], b_dk.to(dk_part.dtype.element_ty), mask=m_sk)
    tl.store(dw + rows[:, None] * K + o_k[None, :], (-b_dw).to(dw.dtype.element_ty), mask=m_sk)
    tl.store(dG_step + rows, dG, mask=m_s)
    tl.store(dG_tok + q_rows, dGq, mask=m_t)


@triton.jit
def wy_bwd_kernel(
    k, v, beta, g, t_inv, d_delta, dw, dk_part, dG_step, dG_tok,
    dk, dv, dbeta, dg,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    i_chunk, i_h = tl.program_id(0), tl.program_id(1)
    _seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    m_sk = m_s[:, None] & (o_k < K)[None, :]
    rows = (tok0.to(tl.int64) * NH + o_s) * H + i_h
    q_rows = (tok0.to(tl.int64) + o_t) * H + i_h

    b_t = tl.load(t_inv + rows[:, None] * BT + o_s[None, :], mask=m_s[:, None], other=0.0)
    b_tt = tl.load(t_inv + rows[None, :] * BT + o_s[:, None], mask=m_s[None, :], other=0.0)
    b_beta = tl.load(beta + rows, mask=m_s, other=0.0).to(tl.float32)
    b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
    b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=(o_k < K)[:, None] & m_s[None, :], other=0.0)
    G, _, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    dG = tl.load(dG_step + rows, mask=m_s, other=0.0)

    # U = T diag(β) V  with  ∂L/∂U = dδ; ∂L/∂T and its transpose are both accumulated (see module doc).
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)
    b_dTt = tl.zeros([BT, BT], dtype=tl.float32)
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_sv = m_s[:, None] & m_v[None, :]
        m_vs = m_v[:, None] & m_s[None, :]
        b_v = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0)
        b_vt = tl.load(v + rows[None, :] * V + o_v[:, None], mask=m_vs, other=0.0)
        b_dd = tl.load(d_delta + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0).to(b_k.dtype)
        b_ddt = tl.load(d_delta + rows[None, :] * V + o_v[:, None], mask=m_vs, other=0.0).to(b_k.dtype)
        b_tdd = tl.dot(b_tt, b_dd)
        tl.store(dv + rows[:, None] * V + o_v[None, :], (b_tdd * b_beta[:, None]).to(dv.dtype.element_ty),
                 mask=m_sv)  # fmt: skip
        b_dbeta += tl.sum(b_tdd * b_v.to(tl.float32), 1)
        b_dT += tl.dot(b_dd, (b_vt * b_beta[None, :]).to(b_k.dtype))
        b_dTt += tl.dot((b_v * b_beta[:, None]).to(b_k.dtype), b_ddt)

    # W = T diag(β e^G) K.
    b_dw = tl.load(dw + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
    b_dwt = tl.load(dw + rows[None, :] * K + o_k[:, None], mask=(o_k < K)[:, None] & m_s[None, :], other=0.0)
    b_tdw = tl.dot(b_tt, b_dw.to(b_k.dtype))
    eg = tl.exp(G)
    b_dk = tl.load(dk_part + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0).to(tl.float32)
    b_dk += b_tdw * (b_beta * eg)[:, None]
    kw = tl.sum(b_tdw * b_k.to(tl.float32), 1) * eg
    b_dbeta += kw
    dG += kw * b_beta
    b_dT += tl.dot(b_dw.to(b_k.dtype), (b_kt * (b_beta * eg)[None, :]).to(b_k.dtype))
    b_dTt += tl.dot((b_k * (b_beta * eg)[:, None]).to(b_k.dtype), b_dwt.to(b_k.dtype))

    # T = (I + A)⁻¹ with A_rj = β_r e^{G_r − G_j} k_r·k_j (r > j): ∂L/∂A = −Tᵀ ∂L/∂T Tᵀ, and its transpose.
    lower = (o_s[:, None] > o_s[None, :]) & m_s[:, None]
    upper = (o_s[:, None] < o_s[None, :]) & m_s[None, :]
    b_dA = -tl.dot(tl.dot(b_tt, b_dT.to(b_k.dtype)).to(b_k.dtype), b_tt)
    b_dAt = -tl.dot(tl.dot(b_t, b_dTt.to(b_k.dtype)).to(b_k.dtype), b_t)
    decay = tl.exp(tl.where(lower, G[:, None] - G[None, :], float("-inf")))
    decay_t = tl.exp(tl.where(upper, G[None, :] - G[:, None], float("-inf")))
    b_dAe = tl.where(lower, b_dA * decay, 0.0)
    b_kk = tl.dot(b_k, b_kt)
    b_dbeta += tl.sum(b_dAe * b_kk, 1)
    b_dAb = b_dAe * b_beta[:, None]
    b_dAb_t = tl.where(upper, b_dAt * decay_t, 0.0) * b_beta[None, :]
    b_dk += tl.dot(b_dAb.to(b_k.dtype), b_k) + tl.dot(b_dAb_t.to(b_k.dtype), b_k)
    b_dAk = tl.where((o_s // NH)[:, None] > (o_s // NH)[None, :], b_dAb * b_kk, 0.0)  # same cancellation
    dG += tl.sum(b_dAk, 1) - tl.sum(b_dAk, 0)

    tl.store(dk + rows[:, None] * K + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_sk)
    tl.store(dbeta + rows, b_dbeta.to(dbeta.dtype.element_ty), mask=m_s)
    if USE_G:
        # Step gradients -> token gradients -> reverse prefix sum (the chunk's G is a prefix sum of g).
        owner = (o_s // NH)[None, :] == o_t[:, None]
        dGt = tl.sum(tl.where(owner & m_s[None, :], dG[None, :], 0.0), 1)
        dGt += tl.load(dG_tok + q_rows, mask=m_t, other=0.0)
        dGt = tl.where(m_t, dGt, 0.0)
        b_dg = tl.sum(dGt, 0) - tl.cumsum(dGt, 0) + dGt
        tl.store(dg + q_rows, b_dg.to(dg.dtype.element_ty), mask=m_t)


def _launch_config(k: Tensor, V: int, use_g: bool, geo: ChunkGeometry, seqs: SequenceLayout,
                   num_warps: int | None) -> tuple[dict, tuple, tuple]:  # fmt: skip
    """Constexprs and launch options, sequence-layout arguments and grid shared by both gradient kernels."""
    H, K = k.shape[2], k.shape[3]
    common = dict(
        H=H, K=K, V=V, NH=geo.num_householder, C=geo.tokens_per_chunk, BT=geo.block_steps,
        BC=geo.block_tokens, BK=max(16, next_power_of_2(K)),
        BV=min(64, max(16, next_power_of_2(V))), USE_G=use_g, IS_VARLEN=seqs.is_varlen,
        num_warps=num_warps or GRADS_NUM_WARPS, num_stages=2 if K <= 128 else 1,
    )  # fmt: skip
    where = (seqs.cu_seqlens, seqs.chunk_offsets, seqs.tokens_per_sequence, seqs.chunks_per_sequence,
             seqs.num_sequences, seqs.search_steps)  # fmt: skip
    return common, where, (seqs.grid_chunks, H)


def dqkw(q: Tensor, k: Tensor, g: Tensor | None, v_new: Tensor, chunk_states: Tensor, d_chunk_states: Tensor,
         d_delta: Tensor, d_out: Tensor, scale: float, geo: ChunkGeometry, seqs: SequenceLayout,
         num_warps: int | None = None, dk_part_dtype: torch.dtype | None = None,
         ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Stage (1): (dq, direct dk, ∂L/∂W, step and token log-gate gradients). ∂L/∂W is in k's dtype; the
    direct dk in ``dk_part_dtype``, by default δ's: fp32, or k's dtype with the ``lowp`` variants (as FLA
    stores them)."""
    B, L, H, K = k.shape
    f32 = dict(dtype=torch.float32, device=k.device)
    dq = torch.empty_like(q)
    # ∂L/∂W in k's dtype: wy_bwd reads it only rounded to that (same values, half the bytes); the direct dk,
    # which wy_bwd adds in fp32, in δ's dtype (fp32 unless lowp or lowp_safe).
    dk_part = torch.empty(B, L, H, K, dtype=dk_part_dtype or v_new.dtype, device=k.device)
    dw = torch.empty(B, L, H, K, dtype=k.dtype, device=k.device)
    dG_step = torch.empty(B, L, H, **f32)
    dG_tok = torch.empty(*q.shape[:3], **f32)
    common, where, grid = _launch_config(k, d_delta.shape[-1], g is not None, geo, seqs, num_warps)
    launch(
        dqkw_kernel, grid,
        q, k, k if g is None else g, v_new, chunk_states, d_chunk_states, d_delta, d_out,
        dq, dk_part, dw, dG_step, dG_tok, *where, scale, **common,
    )  # fmt: skip
    return dq, dk_part, dw, dG_step, dG_tok


def wy_bwd(k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, t_inv: Tensor, d_delta: Tensor,
           dk_part: Tensor, dw: Tensor, dG_step: Tensor, dG_tok: Tensor, geo: ChunkGeometry,
           seqs: SequenceLayout, num_warps: int | None = None,
           ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:  # fmt: skip
    """Stage (2): (dk, dv, dg or None, dβ) in the dtypes of k, v, g, β."""
    dk, dv, dbeta = torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
    dg = None if g is None else torch.empty_like(g)
    common, where, grid = _launch_config(k, v.shape[-1], g is not None, geo, seqs, num_warps)
    launch(
        wy_bwd_kernel, grid,
        k, v, beta, k if g is None else g, t_inv, d_delta, dw, dk_part, dG_step, dG_tok, dk, dv, dbeta,
        dk if dg is None else dg, *where, **common,
    )  # fmt: skip
    return dk, dv, dg, dbeta


def chunk_grads(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, t_inv: Tensor, v_new: Tensor,
    chunk_states: Tensor, d_chunk_states: Tensor, d_delta: Tensor, d_out: Tensor, scale: float,
    geo: ChunkGeometry, seqs: SequenceLayout, num_warps: int | None = None,
    dk_part_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:  # fmt: skip
    """Returns (dq, dk, dv, dg or None, dβ) in the dtypes of q, k, v, g, β: stage (1) then stage (2)."""
    dq, dk_part, dw, dG_step, dG_tok = dqkw(
        q, k, g, v_new, chunk_states, d_chunk_states, d_delta, d_out, scale, geo, seqs, num_warps,
        dk_part_dtype,
    )
    dk, dv, dg, dbeta = wy_bwd(
        k, v, g, beta, t_inv, d_delta, dk_part, dw, dG_step, dG_tok, geo, seqs, num_warps
    )
    return dq, dk, dv, dg, dbeta
