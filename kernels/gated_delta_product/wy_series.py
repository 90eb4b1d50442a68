"""Flag ``wyseries`` (in the default): the UT transform of ``wy_fast.py`` on whole 64-step tiles.

Same outputs (T, W = T diag(βe^G) K, U = T diag(β) V) up to rounding. Why: ``wy_fast`` works on 16×16
tiles, which every warp holds whole (the MMA layout puts all warps on the same 16 rows), so its live state
does not shrink with more warps: 255 registers and a spill stack at 2 warps, 12.5% occupancy, latency-bound
(ncu on an H200, docs/benchmarks.md, GDP 02:12 UTC, eighth session). Here

* the four 16×16 diagonal blocks are one [4, 16, 16] tensor: their forward substitutions (the same
  recurrence, X_i = e_i − Σ_m A_im X_m) advance together and the block axis spreads over the warps;
* with D = (I + A_diag)⁻¹ block-diagonal and N = D·A_off strictly block-lower (N⁴ = 0),
  T = (I + A)⁻¹ = (I + N)⁻¹ D = (I − N + N² − N³) D = D − N(D − N(D − N D)): four [64, 64] products (N and
  three Horner steps) whose rows split over the warps. Expanded, these are exactly the products block forward
  substitution sums (T_20 = −D₂A₂₀D₀ + D₂A₂₁D₁A₁₀D₀, …), only grouped differently — not an element-level
  Neumann series, whose 15 terms can dwarf T. On an H200 the transform took 0.310 against fastwy's 0.501 ms at
  [8,2048,16,64], n_h = 2 (docs/benchmarks.md, GDP 02:50 UTC, eighth session);
* W and U are [64, K] and [64, V] products of T diag(·) rounded once to k's dtype (as in ``wy_fwd``).

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
    row_scaled_f16,
    scaled_f16,
)
from titan_delta_kernels.gated_delta_product.state import split_planes
from titan_delta_kernels.gated_delta_product.wy_fwd import launch_block_transform, wy_fwd


@triton.jit
def _diag_inverses(k, beta, G, rows, m_s, o_k, m_k, K: tl.constexpr, BT: tl.constexpr):
    """(I + A_bb)⁻¹ of the four 16-step diagonal blocks as a block-diagonal [BT, BT] tile (fp32)."""
    o4 = tl.arange(0, 4)
    o16 = tl.arange(0, 16)
    r3 = tl.reshape(rows, (4, 16))
    m3 = tl.reshape(m_s, (4, 16))
    b3 = tl.reshape(beta, (4, 16))
    G3 = tl.reshape(G, (4, 16))
    k3 = tl.load(k + r3[:, :, None] * K + o_k[None, None, :], mask=m3[:, :, None] & m_k[None, None, :],
                 other=0.0)  # fmt: skip
    upper = o16[None, :, None] < o16[None, None, :]
    decay = tl.exp(tl.where(upper, G3[:, None, :] - G3[:, :, None], float("-inf")))
    at = tl.dot(k3, tl.trans(k3, (0, 2, 1))) * b3[:, None, :] * decay  # at[b, c, r] = A_b[r, c], r > c
    x = tl.where(o16[None, :, None] == o16[None, None, :], 1.0, 0.0) + tl.zeros([4, 16, 16], dtype=tl.float32)
    for i in range(1, 16):
        a = tl.sum(tl.where(o16[None, None, :] == i, at, 0.0), 2)  # a[b, m] = A_b[i, m]
        row = tl.sum(a[:, :, None] * x, 1)
        x = x - tl.where(o16[None, :, None] == i, row[:, None, :], 0.0)
    same = o4[:, None, None, None] == o4[None, None, :, None]
    return tl.reshape(tl.where(same, x[:, :, None, :], 0.0), (BT, BT))


@triton.jit
def wy_series_kernel(
    k, v, beta, g, t_inv, w, u, w_scale, u_scale,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr, W_PLANES: tl.constexpr,
    ROW_SCALED: tl.constexpr,
):  # fmt: skip
    """``ROW_SCALED`` (``w16``): W and U stored in fp16, each row scaled by a power of two (``scaled_f16``),
    whose inverse goes to ``w_scale`` / ``u_scale``; U is then one [BT, BV] product (BV covers all of V)."""
    i_chunk, i_h = tl.program_id(0), tl.program_id(1)
    _seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    n_step = n_tok * NH
    step0 = tok0.to(tl.int64) * NH
    o_s = tl.arange(0, BT)
    m_s = o_s < n_step
    rows = (step0 + o_s) * H + i_h
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    b = tl.load(beta + rows, mask=m_s, other=0.0).to(tl.float32)
    G, _, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)

    d = _diag_inverses(k, b, G, rows, m_s, o_k, m_k, K, BT)
    kk = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
    below = (o_s // 16)[:, None] > (o_s // 16)[None, :]
    decay = tl.exp(tl.where(below, G[:, None] - G[None, :], float("-inf")))
    a_off = tl.dot(kk, tl.trans(kk)) * b[:, None] * decay  # A outside the diagonal blocks
    neg_n = -tl.dot(d, a_off, input_precision=PREC)
    # Horner: T = D − N(D − N(D − N D))
    t = tl.dot(neg_n, d, d, input_precision=PREC)
    t = tl.dot(neg_n, t, d, input_precision=PREC)
    t = tl.dot(neg_n, t, d, input_precision=PREC)
    tl.store(t_inv + rows[:, None] * BT + o_s[None, :], t.to(t_inv.dtype.element_ty), mask=m_s[:, None])

    kd = k.dtype.element_ty
    e = b * tl.exp(G)
    kk = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
    w_rows = tl.dot((t * e[None, :]).to(kd), kk)
    if ROW_SCALED:
        w16, w_unscale = scaled_f16(w_rows, 1)
        tl.store(w + rows[:, None] * K + o_k[None, :], w16, mask=m_s[:, None] & m_k[None, :])
        tl.store(w_scale + rows, w_unscale, mask=m_s)
    elif W_PLANES:  # rows [hi | lo] (state.split_planes)
        w_hi = w_rows.to(w.dtype.element_ty)
        w_lo = (w_rows - w_hi.to(tl.float32)).to(w.dtype.element_ty)
        tl.store(w + rows[:, None] * (2 * K) + o_k[None, :], w_hi, mask=m_s[:, None] & m_k[None, :])
        tl.store(w + rows[:, None] * (2 * K) + K + o_k[None, :], w_lo, mask=m_s[:, None] & m_k[None, :])
    else:
        tl.store(w + rows[:, None] * K + o_k[None, :], w_rows.to(w.dtype.element_ty),
                 mask=m_s[:, None] & m_k[None, :])  # fmt: skip
    tb = (t * b[None, :]).to(kd)
    if ROW_SCALED:
        o_v = tl.arange(0, BV)
        m_sv = m_s[:, None] & (o_v < V)[None, :]
        vv = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0)
        u16, u_unscale = scaled_f16(tl.dot(tb, vv), 1)
        tl.store(u + rows[:, None] * V + o_v[None, :], u16, mask=m_sv)
        tl.store(u_scale + rows, u_unscale, mask=m_s)
        return
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        vv = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_s[:, None] & m_v[None, :], other=0.0)
        tl.store(u + rows[:, None] * V + o_v[None, :], tl.dot(tb, vv).to(u.dtype.element_ty),
                 mask=m_s[:, None] & m_v[None, :])  # fmt: skip


# Warps of the series transform: its [64, 64] tiles split over them (4: 16 rows each). At K <= 64 2 warps
# were faster in the ninth session (0.577 -> 0.517 ms at [8,2048,16,64], n_h = 3); the transform has changed
# since (w16 stores W row-scaled in fp16), and in the fourteenth session 4 were faster: 0.490 -> 0.450 ms
# there, 0.309 -> 0.296 at n_h = 2, 0.176 -> 0.165 at n_h = 1, 0.588 -> 0.558 at n_h = 4. At K = 128 2 warps
# were slower (0.481 -> 0.491 ms at [4,4096,16,128], n_h = 2) and 8 far slower at both (H200;
# docs/benchmarks.md, GDP, ninth and fourteenth sessions). The variant key ``wywarps`` overrides it.
SERIES_WY_WARPS = 4


def series_precision(dtype: torch.dtype) -> str:
    """The four [64, 64] products of T: exact for fp32 inputs; tf32 for 16-bit inputs, whose T is stored,
    and meets K and V, rounded to the input dtype (8 significant bits against tf32's 11)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def wy_fwd_series(
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None,
    geo: ChunkGeometry,
    seqs: SequenceLayout,
    inter_dtype: torch.dtype = torch.float32,
    num_warps: int | None = None,
    w_planes: bool = False,
    row_scaled: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Drop-in for ``wy_fwd.wy_fwd`` (same results up to rounding); 128-step blocks go to ``wy_fwd``.
    ``w_planes``: W as planes (``state.split_planes``), written by the kernel from its fp32 product.
    ``row_scaled`` (``w16``, not with planes): W and U in fp16 with a power-of-two scale per row; returns
    (T, W, U, W's scales, U's scales)."""
    row_scaled = row_scaled and not w_planes
    if geo.block_steps != 64:
        t_inv, w, u = wy_fwd(k, v, beta, g, geo, seqs, inter_dtype, num_warps)
        if row_scaled:
            (w16, w_unscale), (u16, u_unscale) = row_scaled_f16(w), row_scaled_f16(u)
            return t_inv, w16, u16, w_unscale, u_unscale
        return t_inv, split_planes(w) if w_planes else w, u
    warps = num_warps or SERIES_WY_WARPS
    return launch_block_transform(wy_series_kernel, k, v, beta, g, geo, seqs, inter_dtype, warps, w_planes,
                                  row_scaled, PREC=series_precision(k.dtype), W_PLANES=w_planes)  # fmt: skip
