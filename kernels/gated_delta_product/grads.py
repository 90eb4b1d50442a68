"""Per-chunk gradients of the backward pass: ``dqkw`` (dq, the direct dk, ∂L/∂W and the log-gate terms of the
output scores; kernel and launcher here), then ``wy_bwd`` (through the UT transform to dk, dv, dβ, dg; the
launcher here, the kernels in ``wy_bwd.py``).

K is cut into BKS-column slices streamed in loops, so one [BT, BKS] slice of a K-wide operand is live at a
time (whole [64, K] tiles took 255 registers per thread at K = 128). ``dqkw``: one V loop builds the
K-independent dS = dO δᵀ and dSᵀ = δ dOᵀ; a K loop sums k qᵀ for the scores' gate gradient; then per K slice
a V loop accumulates the slice's dq, direct dk and ∂L/∂W transposed ([BKS, ·]: 16-bit tiles from memory as
first operand), stored through transposed pointers in k's dtype (wy_bwd rounds ∂L/∂W to it on load).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels.gated_delta_product._common import (
    ChunkGeometry,
    SequenceLayout,
    chunk_log_gates,
    locate_chunk,
)
from titan_delta_kernels.gated_delta_product.launch_table import GdpLaunch, launch_stage
from titan_delta_kernels.gated_delta_product.wy_bwd import wy_bwd_hoisted_kernel, wy_bwd_sliced_kernel

Tensor = torch.Tensor


@triton.jit
def dqkw_sliced_kernel(
    q, k, g, v_new, chunk_states, d_chunk_states, d_delta, d_out,
    dq, dk_part, dw, dG_step, dG_tok,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_chunk, i_h = tl.program_id(0), tl.program_id(1)
    seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    if IS_VARLEN:  # noqa: SIM108 (a constexpr branch, not a runtime select)
        chunk_id = i_c + tl.load(chunk_offsets + seq)
    else:
        chunk_id = i_chunk
    h_base = (chunk_id.to(tl.int64) * H + i_h) * K * V
    # Scalar int64 row bases and int32 in-tile offsets (per-element int64 rows cost registers).
    row0 = tok0.to(tl.int64) * NH * H + i_h
    q_row0 = tok0.to(tl.int64) * H + i_h
    rows = o_s * H
    q_rows = o_t * H
    q += q_row0 * K
    dq += q_row0 * K
    d_out += q_row0 * V
    dG_tok += q_row0
    k += row0 * K
    dk_part += row0 * K
    dw += row0 * K
    v_new += row0 * V
    d_delta += row0 * V
    dG_step += row0
    dt = chunk_states.dtype.element_ty

    # dS = dO δᵀ [BC, BT] and dSᵀ = δ dOᵀ [BT, BC] do not depend on K (both built: no tl.trans).
    b_ds = tl.zeros([BC, BT], dtype=tl.float32)
    b_dst = tl.zeros([BT, BC], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_sv, m_vs = m_s[:, None] & m_v[None, :], m_v[:, None] & m_s[None, :]
        m_tv, m_vt = m_t[:, None] & m_v[None, :], m_v[:, None] & m_t[None, :]
        b_d = tl.load(v_new + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0)
        b_dt = tl.load(v_new + rows[None, :] * V + o_v[:, None], mask=m_vs, other=0.0)
        b_do = tl.load(d_out + q_rows[:, None] * V + o_v[None, :], mask=m_tv, other=0.0)
        b_dot = tl.load(d_out + q_rows[None, :] * V + o_v[:, None], mask=m_vt, other=0.0)
        b_ds += tl.dot(b_do.to(dt), b_dt.to(dt), input_precision=PREC)
        b_dst += tl.dot(b_d.to(dt), b_dot.to(dt), input_precision=PREC)

    G, Gq, G_last = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    causal = ((o_s // NH)[None, :] <= o_t[:, None]) & m_t[:, None]
    b_dsd = tl.where(causal, b_ds * tl.exp(tl.where(causal, Gq[:, None] - G[None, :], 0.0)) * scale, 0.0)
    b_dsd = b_dsd.to(k.dtype.element_ty)
    causal_t = ((o_s // NH)[:, None] <= o_t[None, :]) & m_t[None, :]
    decay_t = tl.exp(tl.where(causal_t, Gq[None, :] - G[:, None], 0.0))
    b_dsd_t = tl.where(causal_t, b_dst * decay_t * scale, 0.0).to(q.dtype.element_ty)

    # Intra-chunk scores: a pair (query i, step r) moves +p to Gq_i and −p to G_r; same-token pairs are
    # dropped (no decay between them). Built transposed ([BT, BC], like dSᵀ), k qᵀ summed over all of K first.
    b_kq = tl.zeros([BT, BC], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = o_k < K
        b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
        b_qt = tl.load(q + q_rows[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_kq += tl.dot(b_k, b_qt, input_precision=PREC)
    earlier_t = ((o_s // NH)[:, None] < o_t[None, :]) & m_t[None, :]  # e^{Gq_i − G_r}: output_fwd_kernel
    b_pt = tl.where(earlier_t, b_kq * decay_t * scale * b_dst, 0.0)
    dGq = tl.sum(b_pt, 0)
    dG = -tl.sum(b_pt, 1)

    q_decay = scale * tl.exp(Gq)
    k_decay = tl.exp(G_last - G)
    kdk = tl.zeros([BT], dtype=tl.float32)
    b_dhh = tl.zeros([BKS], dtype=tl.float32)  # Σ S₀ ⊙ dS, summed over V (then over slices and rows)
    for i_k in range(0, tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = o_k < K
        b_dqt = tl.zeros([BKS, BC], dtype=tl.float32)
        b_dkt = tl.zeros([BKS, BT], dtype=tl.float32)
        b_dwt = tl.zeros([BKS, BT], dtype=tl.float32)
        for i_v in range(0, tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            m_kv = m_k[:, None] & m_v[None, :]
            b_h = tl.load(chunk_states + h_base + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
            b_dh = tl.load(d_chunk_states + h_base + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
            m_vs = m_v[:, None] & m_s[None, :]
            b_dt = tl.load(v_new + rows[None, :] * V + o_v[:, None], mask=m_vs, other=0.0).to(dt)
            b_ddt = tl.load(d_delta + rows[None, :] * V + o_v[:, None], mask=m_vs, other=0.0).to(dt)
            m_vt = m_v[:, None] & m_t[None, :]
            b_dot = tl.load(d_out + q_rows[None, :] * V + o_v[:, None], mask=m_vt, other=0.0).to(dt)
            b_dqt += tl.dot(b_h, b_dot, input_precision=PREC)
            b_dkt += tl.dot(b_dh, b_dt, input_precision=PREC)
            b_dwt += tl.dot(b_h, b_ddt, input_precision=PREC)
            b_dhh += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), 1)

        m_ks = m_k[:, None] & m_s[None, :]
        tl.store(dw + rows[None, :] * K + o_k[:, None], (-b_dwt).to(dw.dtype.element_ty), mask=m_ks)
        m_kt = m_k[:, None] & m_t[None, :]
        b_qt = tl.load(q + q_rows[None, :] * K + o_k[:, None], mask=m_kt, other=0.0)
        b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
        # Inter-chunk output term scale·e^{Gq} q S₀, then the intra-chunk scores' dq.
        b_dqt = b_dqt * q_decay[None, :]
        dGq += tl.sum(b_dqt * b_qt.to(tl.float32), 0)
        b_dqt += tl.dot(b_kt, b_dsd_t, input_precision=PREC)
        tl.store(dq + q_rows[None, :] * K + o_k[:, None], b_dqt.to(dq.dtype.element_ty), mask=m_kt)
        # State update term e^{G_L − G_r} k_r δ_rᵀ and e^{G_L} S₀, then the scores' direct dk.
        b_dkt = b_dkt * k_decay[None, :]
        kdk += tl.sum(b_dkt * b_kt.to(tl.float32), 0)
        b_dkt += tl.dot(b_qt, b_dsd, input_precision=PREC)
        tl.store(dk_part + rows[None, :] * K + o_k[:, None], b_dkt.to(dk_part.dtype.element_ty), mask=m_ks)

    kdk = tl.where(o_s // NH < n_tok - 1, kdk, 0.0)  # same cancellation
    dG -= kdk
    dG_last = tl.sum(b_dhh, 0) * tl.exp(G_last) + tl.sum(kdk, 0)
    dGq += tl.where(o_t == n_tok - 1, dG_last, 0.0)
    tl.store(dG_step + rows, dG, mask=m_s)
    tl.store(dG_tok + q_rows, dGq, mask=m_t)


def dqkw(q: Tensor, k: Tensor, g: Tensor | None, v_new: Tensor, chunk_states: Tensor, d_chunk_states: Tensor,
         d_delta: Tensor, d_out: Tensor, scale: float, geo: ChunkGeometry, seqs: SequenceLayout,
         cfg: GdpLaunch) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, direct dk, ∂L/∂W in k's dtype, step and token log-gate gradients in fp32)."""
    B, L, H, K = k.shape
    dq, dk_part, dw = torch.empty_like(q), torch.empty_like(k), torch.empty_like(k)
    dG_step = torch.empty(B, L, H, dtype=torch.float32, device=k.device)
    dG_tok = torch.empty(*q.shape[:3], dtype=torch.float32, device=k.device)
    cap = {} if cfg.dqkw_max_registers is None else dict(maxnreg=cfg.dqkw_max_registers)
    tensors = (q, k, k if g is None else g, v_new, chunk_states, d_chunk_states, d_delta, d_out,
               dq, dk_part, dw, dG_step, dG_tok)  # fmt: skip
    launch_stage(dqkw_sliced_kernel, (seqs.grid_chunks, H), tensors, geo, seqs, (H, K, d_delta.shape[-1]), g,
                 tail=(scale,), BKS=cfg.grad_block_k, BV=cfg.grad_block_v, PREC=cfg.dot_precision,
                 num_stages=cfg.dqkw_stages, num_warps=cfg.grad_warps, **cap)  # fmt: skip
    return dq, dk_part, dw, dG_step, dG_tok


def wy_bwd(k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, t_inv: Tensor, d_delta: Tensor,
           dk_part: Tensor, dw: Tensor, dG_step: Tensor, dG_tok: Tensor, geo: ChunkGeometry,
           seqs: SequenceLayout, cfg: GdpLaunch) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:  # fmt: skip
    """(dk, dv, dg or None, dβ) in the dtypes of k, v, g, β."""
    dk, dv, dbeta = torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
    dg = None if g is None else torch.empty_like(g)
    # The [BT, BT] scratch of each chunk: its own rows of dk when they are wide enough, else a buffer laid
    # out like T (the kernel reads it back before it writes dk).
    scr = dk if k.shape[-1] >= geo.block_steps else torch.empty(t_inv.shape, dtype=k.dtype, device=k.device)
    tensors = (k, v, beta, k if g is None else g, t_inv, d_delta, dw, dk_part, dG_step, dG_tok, dk, dv, dbeta,
               dk if dg is None else dg, scr)  # fmt: skip
    kernel = wy_bwd_hoisted_kernel if cfg.wy_bwd_hoisted else wy_bwd_sliced_kernel
    launch_stage(kernel, (seqs.grid_chunks, k.shape[2]), tensors, geo, seqs, (*k.shape[2:], v.shape[-1]), g,
                 BKS=cfg.grad_block_k, BV=cfg.grad_block_v, PREC=cfg.dot_precision,
                 num_stages=cfg.wy_bwd_stages, num_warps=cfg.grad_warps, SCR=scr.shape[-1])  # fmt: skip
    return dk, dv, dg, dbeta

