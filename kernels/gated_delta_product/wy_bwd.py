"""Backward of the UT transform per chunk (``wy_bwd``): dk, dv, dβ and dg from ∂L/∂W (dqkw), ∂L/∂δ (the
reverse state pass) and T, with the head dim K streamed in BKS-column slices.

* U = T diag(β) V with ∂L/∂U = dδ gives dv, dβ's V terms and (∂L/∂T)ᵀ (only the transposed one is built).
  Pass 1 over K slices adds W's part of (∂L/∂T)ᵀ; (∂L/∂A)ᵀ = −T (∂L/∂T)ᵀ T; a K loop sums k kᵀ; pass 2
  recomputes Tᵀ·∂L/∂W per slice (dk is written once, from fp32) and adds the direct dk and ∂L/∂A terms.
  Pass 2 needs ∂L/∂A both ways round: the transposed half is read back through a [BT, BT] scratch (dk's own
  rows when K >= BT), a ``tl.debug_barrier()`` on each side (other threads own the elements). A product whose
  result feeds another through registers is laid out with all warps along M (sm_90), so ∂L/∂A enters pass 2
  from memory and pass 2 starts its dk accumulator from the direct dk (``acc=``).
* ``wy_bwd_hoisted_kernel`` (K, V <= 64: one slice, one V tile): the same products, operands and order
  (bitwise under the CPU interpreter), but every global load before the first product: with the loops run
  once nothing is software-pipelined, and the sliced kernel loads each phase's tiles just before use.
* No ``tl.trans``: transposed operands come through transposed pointers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from titan_delta_kernels.gated_delta_product._common import chunk_log_gates, locate_chunk


@triton.jit
def chunk_pointers(
    k, v, beta, t_inv, d_delta, dw, dk_part, dG_step, dG_tok, dk, dv, dbeta, dg, scr, row0, q_row0,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, SCR: tl.constexpr,
):  # fmt: skip
    """Every tensor's pointer moved to the chunk's first step (``row0``) or token (``q_row0``) and head; the
    scratch's row stride is SCR (K when it is dk, BT for a buffer laid out like T)."""
    return (k + row0 * K, v + row0 * V, beta + row0, t_inv + row0 * BT, d_delta + row0 * V, dw + row0 * K,
            dk_part + row0 * K, dG_step + row0, dG_tok + q_row0, dk + row0 * K, dv + row0 * V, dbeta + row0,
            dg + q_row0, scr + row0 * SCR)  # fmt: skip


@triton.jit
def gated_da_t(b_dAt, b_kk, G, b_beta, upper, o_s, NH: tl.constexpr):
    """(∂L/∂A)ᵀ (pairs r > j in ``upper``) through A's decay e^{G_r − G_j} and β_r: (∂L/∂A·β)ᵀ, its dβ terms
    and its step log-gate terms (pairs of one token cancel: no decay between them)."""
    decay_t = tl.exp(tl.where(upper, G[None, :] - G[:, None], float("-inf")))
    b_dAe_t = tl.where(upper, b_dAt * decay_t, 0.0)
    dbeta = tl.sum(b_dAe_t * b_kk, 0)
    b_dAb_t = b_dAe_t * b_beta[None, :]
    b_dAk_t = tl.where((o_s // NH)[:, None] < (o_s // NH)[None, :], b_dAb_t * b_kk, 0.0)
    return b_dAb_t, dbeta, tl.sum(b_dAk_t, 0) - tl.sum(b_dAk_t, 1)


@triton.jit
def token_log_gate_grads(dG, dGt, o_s, o_t, m_s, m_t, NH: tl.constexpr):
    """Step log-gate gradients [BT] plus the tokens' own (``dGt`` [BC]) -> gradients of the tokens' g: each
    token sums its steps, then a reverse prefix sum (the chunk's log gates are a prefix sum of g)."""
    owner = (o_s // NH)[None, :] == o_t[:, None]
    dGt += tl.sum(tl.where(owner & m_s[None, :], dG[None, :], 0.0), 1)
    dGt = tl.where(m_t, dGt, 0.0)
    return tl.sum(dGt, 0) - tl.cumsum(dGt, 0) + dGt


@triton.jit
def wy_bwd_sliced_kernel(
    k, v, beta, g, t_inv, d_delta, dw, dk_part, dG_step, dG_tok,
    dk, dv, dbeta, dg, scr,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr, SCR: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_chunk, i_h = tl.program_id(0), tl.program_id(1)
    _seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    row0 = tok0.to(tl.int64) * NH * H + i_h
    q_row0 = tok0.to(tl.int64) * H + i_h
    rows = o_s * H
    q_rows = o_t * H
    k, v, beta, t_inv, d_delta, dw, dk_part, dG_step, dG_tok, dk, dv, dbeta, dg, scr = chunk_pointers(
        k, v, beta, t_inv, d_delta, dw, dk_part, dG_step, dG_tok, dk, dv, dbeta, dg, scr, row0, q_row0,
        K, V, BT, SCR,
    )  # fmt: skip
    kt_ty = k.dtype.element_ty

    b_tt = tl.load(t_inv + rows[None, :] * BT + o_s[:, None], mask=m_s[None, :], other=0.0)
    b_beta = tl.load(beta + rows, mask=m_s, other=0.0).to(tl.float32)
    G, _, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    dG = tl.load(dG_step + rows, mask=m_s, other=0.0)

    # U = T diag(β) V  with  ∂L/∂U = dδ. Only (∂L/∂T)ᵀ is built.
    b_dTt = tl.zeros([BT, BT], dtype=tl.float32)
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_sv = m_s[:, None] & m_v[None, :]
        m_vs = m_v[:, None] & m_s[None, :]
        b_v = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0)
        b_dd = tl.load(d_delta + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0).to(kt_ty)
        b_ddt = tl.load(d_delta + rows[None, :] * V + o_v[:, None], mask=m_vs, other=0.0).to(kt_ty)
        b_tdd = tl.dot(b_tt, b_dd, input_precision=PREC)
        tl.store(dv + rows[:, None] * V + o_v[None, :], (b_tdd * b_beta[:, None]).to(dv.dtype.element_ty),
                 mask=m_sv)  # fmt: skip
        b_dbeta += tl.sum(b_tdd * b_v.to(tl.float32), 1)
        b_dTt += tl.dot((b_v * b_beta[:, None]).to(kt_ty), b_ddt, input_precision=PREC)

    # W = T diag(β e^G) K, pass 1 over K slices: (∂L/∂T)ᵀ += (β e^G k) ∂L/∂Wᵀ.
    eg = tl.exp(G)
    beg = b_beta * eg
    for i_k in range(0, tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_sk, m_ks = m_s[:, None] & (o_k < K)[None, :], (o_k < K)[:, None] & m_s[None, :]
        b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
        b_dwt = tl.load(dw + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
        b_dTt += tl.dot((b_k * beg[:, None]).to(kt_ty), b_dwt.to(kt_ty), input_precision=PREC)

    # T = (I + A)⁻¹ with A_rj = β_r e^{G_r − G_j} k_r·k_j (r > j): (∂L/∂A)ᵀ = −T (∂L/∂T)ᵀ T. Everything here
    # is in the transposed frame (k kᵀ is symmetric): row j, column r holds the pair (r, j), r > j.
    upper = (o_s[:, None] < o_s[None, :]) & m_s[None, :]
    b_t = tl.load(t_inv + rows[:, None] * BT + o_s[None, :], mask=m_s[:, None], other=0.0)
    b_dTt_t = tl.dot(b_t, b_dTt.to(kt_ty), input_precision=PREC)
    b_dAt = -tl.dot(b_dTt_t.to(kt_ty), b_t, input_precision=PREC)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)  # k kᵀ, summed only now (not live through pass 1)
    for i_k in range(0, tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_sk, m_ks = m_s[:, None] & (o_k < K)[None, :], (o_k < K)[:, None] & m_s[None, :]
        b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
        b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
        b_kk += tl.dot(b_k, b_kt, input_precision=PREC)
    b_dAb_t, dbeta_a, dG_a = gated_da_t(b_dAt, b_kk, G, b_beta, upper, o_s, NH)
    b_dbeta += dbeta_a
    dG += dG_a
    # dk takes ∂L/∂A·β (lower triangle) and its transpose (upper), each rounded to k's dtype: they have
    # disjoint supports, so one product with their sum (exact in k's dtype) is the same as two.
    # Both halves are read back from the scratch, so the pass-2 product does not chain to the ones above.
    tl.store(scr + rows[:, None] * SCR + o_s[None, :], b_dAb_t.to(kt_ty).to(scr.dtype.element_ty),
             mask=m_s[:, None])  # fmt: skip
    tl.debug_barrier()
    b_dAs = tl.load(scr + rows[None, :] * SCR + o_s[:, None], mask=m_s[None, :], other=0.0).to(kt_ty)
    b_dAs += tl.load(scr + rows[:, None] * SCR + o_s[None, :], mask=m_s[:, None], other=0.0).to(kt_ty)
    tl.debug_barrier()  # every thread has read the scratch before pass 2 writes dk over it

    # Pass 2: dk = direct dk + ∂L/∂A terms + Tᵀ∂L/∂W · β e^G, slice by slice; β and gate terms of W.
    kw = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_sk = m_s[:, None] & (o_k < K)[None, :]
        b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
        b_dw = tl.load(dw + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
        b_tdw = tl.dot(b_tt, b_dw.to(kt_ty), input_precision=PREC)
        b_dk = tl.load(dk_part + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0).to(tl.float32)
        b_dk = tl.dot(b_dAs, b_k, acc=b_dk, input_precision=PREC)
        b_dk += b_tdw * beg[:, None]
        kw += tl.sum(b_tdw * b_k.to(tl.float32), 1)
        tl.store(dk + rows[:, None] * K + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_sk)
    kw = kw * eg
    b_dbeta += kw
    dG += kw * b_beta

    tl.store(dbeta + rows, b_dbeta.to(dbeta.dtype.element_ty), mask=m_s)
    if USE_G:
        dGt = tl.load(dG_tok + q_rows, mask=m_t, other=0.0)
        b_dg = token_log_gate_grads(dG, dGt, o_s, o_t, m_s, m_t, NH)
        tl.store(dg + q_rows, b_dg.to(dg.dtype.element_ty), mask=m_t)


@triton.jit
def wy_bwd_hoisted_kernel(
    k, v, beta, g, t_inv, d_delta, dw, dk_part, dG_step, dG_tok,
    dk, dv, dbeta, dg, scr,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr, SCR: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_chunk, i_h = tl.program_id(0), tl.program_id(1)
    _seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BKS)  # the one slice: BKS >= K
    o_v = tl.arange(0, BV)
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    m_k = o_k < K
    m_v = o_v < V
    m_sk, m_ks = m_s[:, None] & m_k[None, :], m_k[:, None] & m_s[None, :]
    m_sv, m_vs = m_s[:, None] & m_v[None, :], m_v[:, None] & m_s[None, :]
    row0 = tok0.to(tl.int64) * NH * H + i_h
    q_row0 = tok0.to(tl.int64) * H + i_h
    rows = o_s * H
    q_rows = o_t * H
    k, v, beta, t_inv, d_delta, dw, dk_part, dG_step, dG_tok, dk, dv, dbeta, dg, scr = chunk_pointers(
        k, v, beta, t_inv, d_delta, dw, dk_part, dG_step, dG_tok, dk, dv, dbeta, dg, scr, row0, q_row0,
        K, V, BT, SCR,
    )  # fmt: skip
    kt_ty = k.dtype.element_ty

    # Every load first: the shared-memory operands, the scalars, the register operands, then the gates.
    b_tt = tl.load(t_inv + rows[None, :] * BT + o_s[:, None], mask=m_s[None, :], other=0.0)
    b_dd = tl.load(d_delta + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0).to(kt_ty)
    b_ddt = tl.load(d_delta + rows[None, :] * V + o_v[:, None], mask=m_vs, other=0.0).to(kt_ty)
    b_dwt = tl.load(dw + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
    b_t = tl.load(t_inv + rows[:, None] * BT + o_s[None, :], mask=m_s[:, None], other=0.0)
    b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
    b_dw = tl.load(dw + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
    b_dkp = tl.load(dk_part + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
    b_beta = tl.load(beta + rows, mask=m_s, other=0.0).to(tl.float32)
    dG = tl.load(dG_step + rows, mask=m_s, other=0.0)
    if USE_G:
        dGt = tl.load(dG_tok + q_rows, mask=m_t, other=0.0)
    b_v = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0)
    b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
    G, _, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)

    # U = T diag(β) V with ∂L/∂U = dδ: dv, the V part of dβ and of (∂L/∂T)ᵀ.
    b_tdd = tl.dot(b_tt, b_dd, input_precision=PREC)
    tl.store(dv + rows[:, None] * V + o_v[None, :], (b_tdd * b_beta[:, None]).to(dv.dtype.element_ty),
             mask=m_sv)  # fmt: skip
    b_dbeta = tl.sum(b_tdd * b_v.to(tl.float32), 1)
    b_dTt = tl.dot((b_v * b_beta[:, None]).to(kt_ty), b_ddt, input_precision=PREC)
    # W = T diag(β e^G) K: (∂L/∂T)ᵀ += (β e^G k) ∂L/∂Wᵀ.
    eg = tl.exp(G)
    beg = b_beta * eg
    b_dTt = tl.dot((b_k * beg[:, None]).to(kt_ty), b_dwt.to(kt_ty), acc=b_dTt, input_precision=PREC)

    # (∂L/∂A)ᵀ = −T (∂L/∂T)ᵀ T in the transposed frame (row j, column r holds the pair (r, j), r > j).
    upper = (o_s[:, None] < o_s[None, :]) & m_s[None, :]
    b_dTt_t = tl.dot(b_t, b_dTt.to(kt_ty), input_precision=PREC)
    b_dAt = -tl.dot(b_dTt_t.to(kt_ty), b_t, input_precision=PREC)
    b_kk = tl.dot(b_k, b_kt, input_precision=PREC)
    b_dAb_t, dbeta_a, dG_a = gated_da_t(b_dAt, b_kk, G, b_beta, upper, o_s, NH)
    b_dbeta += dbeta_a
    dG += dG_a
    # The two halves of ∂L/∂A·β meet through the scratch (as in the sliced kernel); Tᵀ·∂L/∂W, which does not
    # need them, runs while the stores drain.
    tl.store(scr + rows[:, None] * SCR + o_s[None, :], b_dAb_t.to(kt_ty).to(scr.dtype.element_ty),
             mask=m_s[:, None])  # fmt: skip
    b_tdw = tl.dot(b_tt, b_dw.to(kt_ty), input_precision=PREC)
    kw = tl.sum(b_tdw * b_k.to(tl.float32), 1) * eg
    tl.debug_barrier()
    b_dAs = tl.load(scr + rows[None, :] * SCR + o_s[:, None], mask=m_s[None, :], other=0.0).to(kt_ty)
    b_dAs += tl.load(scr + rows[:, None] * SCR + o_s[None, :], mask=m_s[:, None], other=0.0).to(kt_ty)
    tl.debug_barrier()  # every thread has read the scratch before dk is written over it

    # dk = direct dk + ∂L/∂A terms + Tᵀ∂L/∂W · β e^G; β and gate terms of W.
    b_dk = tl.dot(b_dAs, b_k, acc=b_dkp.to(tl.float32), input_precision=PREC)
    b_dk += b_tdw * beg[:, None]
    tl.store(dk + rows[:, None] * K + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_sk)
    b_dbeta += kw
    dG += kw * b_beta

    tl.store(dbeta + rows, b_dbeta.to(dbeta.dtype.element_ty), mask=m_s)
    if USE_G:
        b_dg = token_log_gate_grads(dG, dGt, o_s, o_t, m_s, m_t, NH)
        tl.store(dg + q_rows, b_dg.to(dg.dtype.element_ty), mask=m_t)
