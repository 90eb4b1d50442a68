"""The ``wyhoist`` UT-transform backward kernel: ``wy_bwd_sliced_kernel`` for one K slice and one V tile
(K, V <= 64), with every global load issued before the first product.

Why: at K = 64 the sliced kernel's loops run once each and are unrolled, so nothing is software-pipelined
(its TTGIR has no ``async_copy``), and each phase loads its tiles just before its products: T and Tᵀ, v, dδ
and dδᵀ, k and ∂L/∂Wᵀ, kᵀ, then after the ∂L/∂A scratch k, ∂L/∂W and the direct dk again. With two programs
per SM (252 registers) little covers those waits: on an H200 it took 0.745 ms at [8,2048,16,64], n_h = 3,
against 0.432 ms for FLA's ``prepare_wy_repr_bwd`` (docs/benchmarks.md, GDP, eleventh session).

Here every tile is loaded first (k once in each layout; the sliced kernel reads it row-wise three times):
the shared-memory operands, the scalars, then the tiles that become register operands (v and k, scaled per
row), then the gates. A trip through shared memory into a register operand, or from one vector layout to
another, puts a barrier into the code, and the shared-memory stores ahead of a barrier wait for their loads'
data: no load after it issues before then. The product that does not need the scratch (Tᵀ·∂L/∂W) sits between
the scratch's store and its read-back.

Offline (sm_90a, Triton 3.6, K = V = 64, n_h = 3) its 89 global loads come in 6 runs not separated by a
shared-memory store, barrier or product, 4 of them before the first product, where the sliced kernel's 93 come
in 15 runs spread over the whole kernel; 255 registers, no spill, still 2 programs per SM
(docs/kernels_gated_delta_product.md, thirteenth session).

Every product takes the same operands in the same dtypes in the same order as the sliced kernel, so the
results are its results (bitwise under the CPU interpreter). Launcher: ``grads_sliced.wy_bwd``
(``hoisted=True`` where K and V fit one tile). No ``tl.trans`` (see ``grads.py``): transposed operands come
through transposed pointers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from titan_delta_kernels.gated_delta_product._common import chunk_log_gates, locate_chunk
from titan_delta_kernels.gated_delta_product.wy_bwd_sliced import (
    chunk_pointers,
    gated_da_t,
    token_log_gate_grads,
)


@triton.jit
def wy_bwd_hoisted_kernel(
    k, v, beta, g, t_inv, d_delta, dw, dk_part, dG_step, dG_tok,
    dk, dv, dbeta, dg, scr,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr, SCR: tl.constexpr,
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

    # Every load first, in the order the module docstring gives.
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
    b_tdd = tl.dot(b_tt, b_dd)
    tl.store(dv + rows[:, None] * V + o_v[None, :], (b_tdd * b_beta[:, None]).to(dv.dtype.element_ty),
             mask=m_sv)  # fmt: skip
    b_dbeta = tl.sum(b_tdd * b_v.to(tl.float32), 1)
    b_dTt = tl.dot((b_v * b_beta[:, None]).to(kt_ty), b_ddt)
    # W = T diag(β e^G) K: (∂L/∂T)ᵀ += (β e^G k) ∂L/∂Wᵀ.
    eg = tl.exp(G)
    beg = b_beta * eg
    b_dTt = tl.dot((b_k * beg[:, None]).to(kt_ty), b_dwt.to(kt_ty), acc=b_dTt)

    # (∂L/∂A)ᵀ = −T (∂L/∂T)ᵀ T in the transposed frame (row j, column r holds the pair (r, j), r > j).
    upper = (o_s[:, None] < o_s[None, :]) & m_s[None, :]
    b_dAt = -tl.dot(tl.dot(b_t, b_dTt.to(kt_ty)).to(kt_ty), b_t)
    b_kk = tl.dot(b_k, b_kt)
    b_dAb_t, dbeta_a, dG_a = gated_da_t(b_dAt, b_kk, G, b_beta, upper, o_s, NH)
    b_dbeta += dbeta_a
    dG += dG_a
    # The two halves of ∂L/∂A·β meet through the scratch (as in the sliced kernel); Tᵀ·∂L/∂W, which does not
    # need them, runs while the stores drain.
    tl.store(scr + rows[:, None] * SCR + o_s[None, :], b_dAb_t.to(kt_ty).to(scr.dtype.element_ty),
             mask=m_s[:, None])  # fmt: skip
    b_tdw = tl.dot(b_tt, b_dw.to(kt_ty))
    kw = tl.sum(b_tdw * b_k.to(tl.float32), 1) * eg
    tl.debug_barrier()
    b_dAs = tl.load(scr + rows[None, :] * SCR + o_s[:, None], mask=m_s[None, :], other=0.0).to(kt_ty)
    b_dAs += tl.load(scr + rows[:, None] * SCR + o_s[None, :], mask=m_s[:, None], other=0.0).to(kt_ty)
    tl.debug_barrier()  # every thread has read the scratch before dk is written over it

    # dk = direct dk + ∂L/∂A terms + Tᵀ∂L/∂W · β e^G; β and gate terms of W.
    b_dk = tl.dot(b_dAs, b_k, acc=b_dkp.to(tl.float32))
    b_dk += b_tdw * beg[:, None]
    tl.store(dk + rows[:, None] * K + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_sk)
    b_dbeta += kw
    dG += kw * b_beta

    tl.store(dbeta + rows, b_dbeta.to(dbeta.dtype.element_ty), mask=m_s)
    if USE_G:
        b_dg = token_log_gate_grads(dG, dGt, o_s, o_t, m_s, m_t, NH)
        tl.store(dg + q_rows, b_dg.to(dg.dtype.element_ty), mask=m_t)
