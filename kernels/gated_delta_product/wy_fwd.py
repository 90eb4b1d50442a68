"""UT transform per chunk: T = (I + A)⁻¹ with A = strict_lower(diag(β) KKᵀ ⊙ decay), W = T diag(βe^G) K and
U = T diag(β) V.

Then δ = U − W S₀ for the state S₀ entering the chunk: n_h·C rank-1 updates become two products per chunk.
T is kept for the backward, W and U feed the forward state pass. 64-step blocks (n_h <= 4) run
``wy_series_kernel``: the four 16×16 diagonal blocks are one [4, 16, 16] tensor whose forward substitutions
advance together with the block axis over the warps (separate 16×16 tiles, each whole in every warp, spilled
registers); then T = D − N(D − N(D − N D)) with D the block-diagonal inverse and N = D·A_off (N⁴ = 0): the
products block forward substitution sums, grouped differently (not an element-level Neumann series, whose
terms can dwarf T). For 16-bit inputs W and U are stored as fp16 with one power-of-two scale per row.
128-step blocks (n_h >= 5) run ``wy_fwd_kernel`` (``invert_unit_lower``), whose fp32 W and U are row-scaled
afterwards in PyTorch for 16-bit inputs (``row_scaled_f16``, bitwise the kernel's scaling).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import next_power_of_2
from titan_delta_kernels.gated_delta_product._common import (
    ChunkGeometry,
    SequenceLayout,
    chunk_log_gates,
    locate_chunk,
    row_scaled_f16,
    scaled_f16,
)
from titan_delta_kernels.gated_delta_product.launch_table import GdpLaunch, launch_stage


@triton.jit
def _diag_inverses(k, beta, G, rows, m_s, o_k, m_k, K: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr):
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
    # at[b, c, r] = A_b[r, c], r > c
    at = tl.dot(k3, tl.trans(k3, (0, 2, 1)), input_precision=PREC) * b3[:, None, :] * decay
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
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr, ROW_SCALED: tl.constexpr,
):  # fmt: skip
    """One 64-step chunk. ``ROW_SCALED`` (16-bit inputs): W and U in fp16 with a power-of-two scale per row
    (``scaled_f16``; the inverses go to ``w_scale``, ``u_scale``), U in one [BT, BV] product (BV ≥ V)."""
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

    d = _diag_inverses(k, b, G, rows, m_s, o_k, m_k, K, BT, PREC)
    kk = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
    below = (o_s // 16)[:, None] > (o_s // 16)[None, :]
    decay = tl.exp(tl.where(below, G[:, None] - G[None, :], float("-inf")))
    a_off = tl.dot(kk, tl.trans(kk), input_precision=PREC) * b[:, None] * decay  # A off the diagonal blocks
    neg_n = -tl.dot(d, a_off, input_precision=PREC)
    # Horner: T = D − N(D − N(D − N D))
    t = tl.dot(neg_n, d, d, input_precision=PREC)
    t = tl.dot(neg_n, t, d, input_precision=PREC)
    t = tl.dot(neg_n, t, d, input_precision=PREC)
    tl.store(t_inv + rows[:, None] * BT + o_s[None, :], t.to(t_inv.dtype.element_ty), mask=m_s[:, None])

    kd = k.dtype.element_ty
    e = b * tl.exp(G)
    kk = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
    w_rows = tl.dot((t * e[None, :]).to(kd), kk, input_precision=PREC)
    if ROW_SCALED:
        w16, w_unscale = scaled_f16(w_rows, 1)
        tl.store(w + rows[:, None] * K + o_k[None, :], w16, mask=m_s[:, None] & m_k[None, :])
        tl.store(w_scale + rows, w_unscale, mask=m_s)
    else:
        tl.store(w + rows[:, None] * K + o_k[None, :], w_rows.to(w.dtype.element_ty),
                 mask=m_s[:, None] & m_k[None, :])  # fmt: skip
    tb = (t * b[None, :]).to(kd)
    if ROW_SCALED:
        o_v = tl.arange(0, BV)
        m_sv = m_s[:, None] & (o_v < V)[None, :]
        vv = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0)
        u16, u_unscale = scaled_f16(tl.dot(tb, vv, input_precision=PREC), 1)
        tl.store(u + rows[:, None] * V + o_v[None, :], u16, mask=m_sv)
        tl.store(u_scale + rows, u_unscale, mask=m_s)
        return
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        vv = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_s[:, None] & m_v[None, :], other=0.0)
        tl.store(u + rows[:, None] * V + o_v[None, :],
                 tl.dot(tb, vv, input_precision=PREC).to(u.dtype.element_ty),
                 mask=m_s[:, None] & m_v[None, :])  # fmt: skip


@triton.jit
def invert_unit_lower(A, BT: tl.constexpr, PREC: tl.constexpr):
    """(I + A)⁻¹ for strictly lower-triangular A [BT, BT]. Diagonal 16×16 blocks by forward substitution, one
    row of every block per round (15 rounds, not BT − 1); then (I + N)⁻¹ D⁻¹ with D⁻¹ their inverse and
    N = D⁻¹·(A's strictly block-lower part), nilpotent of order BT/16, summed by Horner in matmuls."""
    o = tl.arange(0, BT)
    eye = (o[:, None] == o[None, :]).to(tl.float32)
    same_block = (o[:, None] // 16) == (o[None, :] // 16)
    X = tl.where(same_block, -A, 0.0)
    for i in range(1, 16):
        sel = (o % 16 == i)[:, None]
        x = tl.sum(tl.where(sel, X, 0.0), 0)
        x = x + tl.sum(x[:, None] * X, 0)
        X = tl.where(sel & same_block, x[None, :], X)
    d_inv = X + eye
    n = tl.dot(d_inv, tl.where(same_block, 0.0, A), input_precision=PREC)
    p = eye - n
    for _ in tl.static_range(BT // 16 - 2):
        p = eye - tl.dot(n, p, input_precision=PREC)
    return tl.dot(p, d_inv, input_precision=PREC)


@triton.jit
def wy_fwd_kernel(
    k, v, beta, g, t_inv, w, u,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The transform of one chunk of any block size (128-step blocks, n_h >= 5): W and U in fp32."""
    i_chunk, i_h = tl.program_id(0), tl.program_id(1)
    _seq, i_c, bos, eos = locate_chunk(i_chunk, cu_seqlens, chunk_offsets, T, NT, N, search_steps, IS_VARLEN)
    tok0 = bos + i_c * C
    if tok0 >= eos:
        return
    n_tok = tl.minimum(C, eos - tok0)
    n_step = n_tok * NH
    step0 = tok0.to(tl.int64) * NH
    o_s = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_s = o_s < n_step
    rows = (step0 + o_s) * H + i_h

    b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & (o_k < K)[None, :], other=0.0)
    b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=(o_k < K)[:, None] & m_s[None, :], other=0.0)
    b_beta = tl.load(beta + rows, mask=m_s, other=0.0).to(tl.float32)
    G, _, _ = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)

    lower = o_s[:, None] > o_s[None, :]
    # β scales rows after the product (exact), and T diag(·) is rounded once before meeting K or V.
    decay = tl.exp(tl.where(lower, G[:, None] - G[None, :], float("-inf")))
    b_T = invert_unit_lower(tl.dot(b_k, b_kt, input_precision=PREC) * b_beta[:, None] * decay, BT, PREC)
    tl.store(t_inv + rows[:, None] * BT + o_s[None, :], b_T.to(t_inv.dtype.element_ty), mask=m_s[:, None])

    b_tw = (b_T * (b_beta * tl.exp(G))[None, :]).to(b_k.dtype)
    m_sk = m_s[:, None] & (o_k < K)[None, :]
    tl.store(w + rows[:, None] * K + o_k[None, :],
             tl.dot(b_tw, b_k, input_precision=PREC).to(w.dtype.element_ty), mask=m_sk)  # fmt: skip
    b_tu = (b_T * b_beta[None, :]).to(b_k.dtype)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = m_s[:, None] & (o_v < V)[None, :]
        b_v = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_v, other=0.0)
        tl.store(u + rows[:, None] * V + o_v[None, :],
                 tl.dot(b_tu, b_v, input_precision=PREC).to(u.dtype.element_ty), mask=m_v)  # fmt: skip


def wy_fwd(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None, geo: ChunkGeometry,
    seqs: SequenceLayout, cfg: GdpLaunch,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """Returns (T [B,L,H,BT] in k's dtype, W [B,L,H,K], U [B,L,H,V], W's row scales, U's row scales) for the
    L = T·n_h steps: W and U fp32 with no scales for fp32 inputs, row-scaled fp16 for 16-bit inputs."""
    B, L, H, K = k.shape
    V = v.shape[-1]
    t_inv = k.new_empty(B, L, H, geo.block_steps)
    row_scaled = cfg.sixteen_bit and cfg.wy_series  # written scaled by the kernel
    store = torch.float16 if row_scaled else torch.float32
    w = torch.empty(B, L, H, K, dtype=store, device=k.device)
    u = torch.empty(B, L, H, V, dtype=store, device=k.device)
    # W's and U's row scales (unused pointers where the kernel writes fp32)
    scales = [k.new_empty(B, L, H, dtype=torch.float32) for _ in "wu"] if row_scaled else [beta, beta]
    kernel, extra = (wy_series_kernel, (*scales,)) if cfg.wy_series else (wy_fwd_kernel, ())
    constexprs = dict(ROW_SCALED=row_scaled) if cfg.wy_series else {}
    tensors = (k, v, beta, k if g is None else g, t_inv, w, u, *extra)
    launch_stage(kernel, (seqs.grid_chunks, H), tensors, geo, seqs, (H, K, V), g, BV=cfg.wy_block_v,
                 BK=max(16, next_power_of_2(K)), PREC=cfg.dot_precision, num_warps=cfg.wy_warps,
                 **constexprs)  # fmt: skip
    if row_scaled:
        return t_inv, w, u, *scales
    if cfg.sixteen_bit:
        (w, w_scale), (u, u_scale) = row_scaled_f16(w), row_scaled_f16(u)
        return t_inv, w, u, w_scale, u_scale
    return t_inv, w, u, None, None
