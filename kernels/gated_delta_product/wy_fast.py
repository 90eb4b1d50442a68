"""Variant ``fastwy``: the UT transform of ``wy_fwd.py`` computed on 16-step blocks.

Same outputs (T, W = T diag(βe^G) K, U = T diag(β) V) up to rounding. Why it should be faster: ``wy_fwd``
inverts the 64×64 triangle on whole 64×64 register tiles — 15 rounds of two cross-warp reductions over
4,096 elements, 4× the elements the four 16×16 diagonal blocks hold — and loads K twice. Here:

* each 16×16 block of A is a product of two 16-row slices of K, loaded once (``tl.trans`` of a *loaded*
  tile, not of a dot result, so the Hopper miscompile described in ``grads.py`` does not apply);
* the diagonal blocks are inverted by forward substitution on [16, 16] tiles with one reduction per round:
  the row of A a round needs is read as a column of Aᵀ, which is the same symmetric KKᵀ product masked the
  other way (no transpose); the four blocks are independent, so one loop advances all four;
* the blocks below the diagonal follow by block forward substitution, T_ij = −D_i Σ_{j≤m<i} A_im T_mj
  (16 fp32 16×16×16 products in IEEE precision, cheap at this size): the same recurrence as the scalar
  one, so it keeps forward substitution's stability (no Neumann series, whose terms can dwarf T);
* W and U are accumulated per 16-row block from the ≤ 4 non-zero blocks of its row of T.

Only the 64-step block (n_h ≤ 4) has this path; 128-step blocks (n_h ≥ 5) run ``wy_fwd``.
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
from titan_delta_kernels.gated_delta_product.wy_fwd import launch_block_transform, wy_fwd


@triton.jit
def _rows(step0, b: tl.constexpr, n_step, H, i_h):
    """Row offsets (in units of a head row) and validity of the steps of block b."""
    o = b * 16 + tl.arange(0, 16)
    return (step0 + o) * H + i_h, o < n_step


@triton.jit
def _gates(Gq, b: tl.constexpr, NH: tl.constexpr, BC: tl.constexpr):
    """Log gates of the steps of block b, copied from the token prefix sums (bitwise chunk_log_gates' G)."""
    o = b * 16 + tl.arange(0, 16)
    o_t = tl.arange(0, BC)
    return tl.sum(tl.where(tl.minimum(o // NH, BC - 1)[:, None] == o_t[None, :], Gq[None, :], 0.0), 1)


@triton.jit
def _diag_at(k_i, beta_i, G_i):
    """Aᵀ of a diagonal block: Aᵀ[c, r] = β_r e^{G_r − G_c} k_r·k_c for r > c, zero elsewhere."""
    o = tl.arange(0, 16)
    upper = o[:, None] < o[None, :]
    decay_t = tl.exp(tl.where(upper, G_i[None, :] - G_i[:, None], float("-inf")))
    return tl.dot(k_i, tl.trans(k_i)) * beta_i[None, :] * decay_t


@triton.jit
def _below(k_i, k_j, beta_i, G_i, G_j):
    """A_ij for a block below the diagonal (every entry has row step > column step)."""
    return tl.dot(k_i, tl.trans(k_j)) * beta_i[:, None] * tl.exp(G_i[:, None] - G_j[None, :])


@triton.jit
def _subst(At, X, i):
    """Row i of (I + A)⁻¹ from the finished rows above it: X_i = e_i − Σ_m A_im X_m."""
    o = tl.arange(0, 16)
    a = tl.sum(tl.where(o[None, :] == i, At, 0.0), 1)  # A_i,: as a column vector (over m)
    return X - tl.where(o[:, None] == i, tl.sum(a[:, None] * X, 0)[None, :], 0.0)


@triton.jit
def _mm(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _apply(t0, t1, t2, t3, x0, x1, x2, x3, NB: tl.constexpr):
    """Σ_{j<NB} t_j x_j (one 16-row block of T·diag(·)·X); unused arguments are ignored."""
    acc = tl.dot(t0, x0)
    if NB > 1:
        acc += tl.dot(t1, x1)
    if NB > 2:
        acc += tl.dot(t2, x2)
    if NB > 3:
        acc += tl.dot(t3, x3)
    return acc


@triton.jit
def _store_t_row(t_inv, rows, m, b: tl.constexpr, t0, t1, t2, t3, BT: tl.constexpr):
    """Row block b of T: its b + 1 blocks on and left of the diagonal, zeros to the right."""
    o = tl.arange(0, 16)
    base = t_inv + rows[:, None] * BT
    ty = t_inv.dtype.element_ty
    tl.store(base + o[None, :], t0.to(ty), mask=m[:, None])
    if b > 0:
        tl.store(base + 16 + o[None, :], t1.to(ty), mask=m[:, None])
    if b > 1:
        tl.store(base + 32 + o[None, :], t2.to(ty), mask=m[:, None])
    if b > 2:
        tl.store(base + 48 + o[None, :], t3.to(ty), mask=m[:, None])
    if b < 3:
        o_s = tl.arange(0, BT)
        zeros = tl.zeros([16, BT], dtype=tl.float32).to(ty)
        tl.store(base + o_s[None, :], zeros, mask=m[:, None] & (o_s >= 16 * (b + 1))[None, :])


@triton.jit
def wy_fast_kernel(
    k, v, beta, g, t_inv, w, u,
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
    n_step = n_tok * NH
    step0 = tok0.to(tl.int64) * NH
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    r0, m0 = _rows(step0, 0, n_step, H, i_h)
    r1, m1 = _rows(step0, 1, n_step, H, i_h)
    r2, m2 = _rows(step0, 2, n_step, H, i_h)
    r3, m3 = _rows(step0, 3, n_step, H, i_h)
    k0 = tl.load(k + r0[:, None] * K + o_k[None, :], mask=m0[:, None] & m_k[None, :], other=0.0)
    k1 = tl.load(k + r1[:, None] * K + o_k[None, :], mask=m1[:, None] & m_k[None, :], other=0.0)
    k2 = tl.load(k + r2[:, None] * K + o_k[None, :], mask=m2[:, None] & m_k[None, :], other=0.0)
    k3 = tl.load(k + r3[:, None] * K + o_k[None, :], mask=m3[:, None] & m_k[None, :], other=0.0)
    b0 = tl.load(beta + r0, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(beta + r1, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(beta + r2, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(beta + r3, mask=m3, other=0.0).to(tl.float32)
    _, Gq, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    G0, G1 = _gates(Gq, 0, NH, BC), _gates(Gq, 1, NH, BC)
    G2, G3 = _gates(Gq, 2, NH, BC), _gates(Gq, 3, NH, BC)

    # Diagonal blocks: four independent forward substitutions advanced together.
    a0, a1, a2, a3 = _diag_at(k0, b0, G0), _diag_at(k1, b1, G1), _diag_at(k2, b2, G2), _diag_at(k3, b3, G3)
    o16 = tl.arange(0, 16)
    eye = (o16[:, None] == o16[None, :]).to(tl.float32)
    d0, d1, d2, d3 = eye, eye, eye, eye
    for i in range(1, 16):
        d0, d1, d2, d3 = _subst(a0, d0, i), _subst(a1, d1, i), _subst(a2, d2, i), _subst(a3, d3, i)
    # Blocks below the diagonal: T_ij = −D_i Σ_{j≤m<i} A_im T_mj.
    a10, a21, a32 = _below(k1, k0, b1, G1, G0), _below(k2, k1, b2, G2, G1), _below(k3, k2, b3, G3, G2)
    a20, a31, a30 = _below(k2, k0, b2, G2, G0), _below(k3, k1, b3, G3, G1), _below(k3, k0, b3, G3, G0)
    t10 = -_mm(d1, _mm(a10, d0))
    t21 = -_mm(d2, _mm(a21, d1))
    t32 = -_mm(d3, _mm(a32, d2))
    t20 = -_mm(d2, _mm(a20, d0) + _mm(a21, t10))
    t31 = -_mm(d3, _mm(a31, d1) + _mm(a32, t21))
    t30 = -_mm(d3, _mm(a30, d0) + _mm(a31, t10) + _mm(a32, t20))
    _store_t_row(t_inv, r0, m0, 0, d0, d0, d0, d0, BT)
    _store_t_row(t_inv, r1, m1, 1, t10, d1, d1, d1, BT)
    _store_t_row(t_inv, r2, m2, 2, t20, t21, d2, d2, BT)
    _store_t_row(t_inv, r3, m3, 3, t30, t31, t32, d3, BT)

    # W = T diag(βe^G) K: T diag(·) is rounded once to k's dtype before meeting K (as in wy_fwd).
    kd = k0.dtype
    e0, e1, e2, e3 = b0 * tl.exp(G0), b1 * tl.exp(G1), b2 * tl.exp(G2), b3 * tl.exp(G3)
    w0 = _apply((d0 * e0[None, :]).to(kd), d0, d0, d0, k0, k0, k0, k0, 1)
    w1 = _apply((t10 * e0[None, :]).to(kd), (d1 * e1[None, :]).to(kd), d1, d1, k0, k1, k1, k1, 2)
    w2 = _apply((t20 * e0[None, :]).to(kd), (t21 * e1[None, :]).to(kd), (d2 * e2[None, :]).to(kd), d2,
                k0, k1, k2, k2, 3)  # fmt: skip
    w3 = _apply((t30 * e0[None, :]).to(kd), (t31 * e1[None, :]).to(kd), (t32 * e2[None, :]).to(kd),
                (d3 * e3[None, :]).to(kd), k0, k1, k2, k3, 4)  # fmt: skip
    wt = w.dtype.element_ty
    tl.store(w + r0[:, None] * K + o_k[None, :], w0.to(wt), mask=m0[:, None] & m_k[None, :])
    tl.store(w + r1[:, None] * K + o_k[None, :], w1.to(wt), mask=m1[:, None] & m_k[None, :])
    tl.store(w + r2[:, None] * K + o_k[None, :], w2.to(wt), mask=m2[:, None] & m_k[None, :])
    tl.store(w + r3[:, None] * K + o_k[None, :], w3.to(wt), mask=m3[:, None] & m_k[None, :])

    # U = T diag(β) V, one V tile at a time.
    u00, u11, u22, u33 = (d0 * b0[None, :]).to(kd), (d1 * b1[None, :]).to(kd), (d2 * b2[None, :]).to(kd), \
        (d3 * b3[None, :]).to(kd)  # fmt: skip
    u10, u20, u30 = (t10 * b0[None, :]).to(kd), (t20 * b0[None, :]).to(kd), (t30 * b0[None, :]).to(kd)
    u21, u31, u32 = (t21 * b1[None, :]).to(kd), (t31 * b1[None, :]).to(kd), (t32 * b2[None, :]).to(kd)
    ut = u.dtype.element_ty
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        v0 = tl.load(v + r0[:, None] * V + o_v[None, :], mask=m0[:, None] & m_v[None, :], other=0.0)
        v1 = tl.load(v + r1[:, None] * V + o_v[None, :], mask=m1[:, None] & m_v[None, :], other=0.0)
        v2 = tl.load(v + r2[:, None] * V + o_v[None, :], mask=m2[:, None] & m_v[None, :], other=0.0)
        v3 = tl.load(v + r3[:, None] * V + o_v[None, :], mask=m3[:, None] & m_v[None, :], other=0.0)
        tl.store(u + r0[:, None] * V + o_v[None, :], _apply(u00, u00, u00, u00, v0, v0, v0, v0, 1).to(ut),
                 mask=m0[:, None] & m_v[None, :])  # fmt: skip
        tl.store(u + r1[:, None] * V + o_v[None, :], _apply(u10, u11, u11, u11, v0, v1, v1, v1, 2).to(ut),
                 mask=m1[:, None] & m_v[None, :])  # fmt: skip
        tl.store(u + r2[:, None] * V + o_v[None, :], _apply(u20, u21, u22, u22, v0, v1, v2, v2, 3).to(ut),
                 mask=m2[:, None] & m_v[None, :])  # fmt: skip
        tl.store(u + r3[:, None] * V + o_v[None, :], _apply(u30, u31, u32, u33, v0, v1, v2, v3, 4).to(ut),
                 mask=m3[:, None] & m_v[None, :])  # fmt: skip


# 2 warps: the UT transform at [4,4096,16,128], n_h = 2 went 0.889 -> 0.584 ms against 4 (H200, 2026-11-21,
# docs/benchmarks.md); ``wywarps=N`` overrides it.
FAST_WY_WARPS = 2


def wy_fwd_fast(
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None,
    geo: ChunkGeometry,
    seqs: SequenceLayout,
    inter_dtype: torch.dtype = torch.float32,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop-in for ``wy_fwd.wy_fwd`` (same results up to rounding); 128-step blocks go to ``wy_fwd``."""
    if geo.block_steps != 64:
        return wy_fwd(k, v, beta, g, geo, seqs, inter_dtype, num_warps)
    return launch_block_transform(wy_fast_kernel, k, v, beta, g, geo, seqs, inter_dtype,
                                  num_warps or FAST_WY_WARPS)  # fmt: skip
