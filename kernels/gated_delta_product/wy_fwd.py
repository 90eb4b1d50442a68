"""UT transform per chunk: T = (I + strict_lower(diag(β) KKᵀ ⊙ decay))⁻¹, W = T diag(βe^G) K, U = T diag(β) V.

With these, the chunk's delta-rule corrections are δ = U − W S₀ for the state S₀ entering the chunk, which
turns n_h·C sequential rank-1 updates into two matrix products per chunk (see the reference's derivation).
T is kept for the backward pass (one BT-wide row per step), W and U feed the state pass.
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
from titan_delta_kernels.gated_delta_product.state import plane_dtype


@triton.jit
def invert_unit_lower(A, BT: tl.constexpr):
    """(I + A)⁻¹ for strictly lower-triangular A [BT, BT]: 16×16 diagonal blocks, then a block Neumann series.

    Diagonal blocks: forward substitution X_i = −A_i − Σ_{j<i} A_ij X_j, one row of every block per round
    (blocks own disjoint columns, so their rows can share one reduction) — 15 rounds instead of BT − 1.
    Off-diagonal: with D⁻¹ the block-diagonal inverse and L the strictly block-lower part of A,
    (I + A)⁻¹ = (I + N)⁻¹ D⁻¹ with N = D⁻¹L nilpotent of order BT/16, summed by Horner in matmuls.
    """
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
    n = tl.dot(d_inv, tl.where(same_block, 0.0, A))
    p = eye - n
    for _ in tl.static_range(BT // 16 - 2):
        p = eye - tl.dot(n, p)
    return tl.dot(p, d_inv)


@triton.jit
def wy_fwd_kernel(
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
    b_T = invert_unit_lower(tl.dot(b_k, b_kt) * b_beta[:, None] * decay, BT)
    tl.store(t_inv + rows[:, None] * BT + o_s[None, :], b_T.to(t_inv.dtype.element_ty), mask=m_s[:, None])

    b_tw = (b_T * (b_beta * tl.exp(G))[None, :]).to(b_k.dtype)
    m_sk = m_s[:, None] & (o_k < K)[None, :]
    tl.store(w + rows[:, None] * K + o_k[None, :], tl.dot(b_tw, b_k).to(w.dtype.element_ty), mask=m_sk)
    b_tu = (b_T * b_beta[None, :]).to(b_k.dtype)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = m_s[:, None] & (o_v < V)[None, :]
        b_v = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_v, other=0.0)
        tl.store(u + rows[:, None] * V + o_v[None, :], tl.dot(b_tu, b_v).to(u.dtype.element_ty), mask=m_v)


def launch_block_transform(
    kernel: triton.JITFunction, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None,
    geo: ChunkGeometry, seqs: SequenceLayout, inter_dtype: torch.dtype, num_warps: int,
    w_planes: bool = False, row_scaled: bool | None = None, **constexprs: object,
) -> tuple[torch.Tensor, ...]:
    """Outputs and launch shared by the UT transforms (``wy_fwd_kernel``, ``wy_fast_kernel``,
    ``wy_series_kernel``: one signature): one program per (chunk, head); ``constexprs`` are a kernel's own
    extra ones. ``w_planes``: W is allocated as planes (``state.split_planes``), which the kernel writes.

    ``row_scaled`` (False or True: only ``wy_series_kernel``, which takes the two scale pointers after u):
    with True W and U are fp16 with one power-of-two scale per row (``w16``), and the result is
    (T, W, U, W's scales, U's scales)."""
    B, L, H, K = k.shape
    V = v.shape[-1]
    t_inv = k.new_empty(B, L, H, geo.block_steps)
    store_dtype = torch.float16 if row_scaled else inter_dtype
    if w_planes:
        w = torch.empty(B, L, H, 2 * K, dtype=plane_dtype(), device=k.device)
    else:
        w = torch.empty(B, L, H, K, dtype=store_dtype, device=k.device)
    u = torch.empty(B, L, H, V, dtype=store_dtype, device=k.device)
    scales: tuple[torch.Tensor, ...] = ()
    if row_scaled:
        scales = (k.new_empty(B, L, H, dtype=torch.float32), k.new_empty(B, L, H, dtype=torch.float32))
    elif row_scaled is not None:
        scales = (beta, beta)  # unused pointers
    if row_scaled is not None:
        constexprs["ROW_SCALED"] = row_scaled
    launch(
        kernel, (seqs.grid_chunks, H),
        k, v, beta, k if g is None else g, t_inv, w, u, *scales,
        seqs.cu_seqlens, seqs.chunk_offsets, seqs.tokens_per_sequence, seqs.chunks_per_sequence,
        seqs.num_sequences, seqs.search_steps,
        H=H, K=K, V=V, NH=geo.num_householder, C=geo.tokens_per_chunk, BT=geo.block_steps,
        BC=geo.block_tokens, BK=max(16, next_power_of_2(K)),
        BV=min(128 if row_scaled else 64, max(16, next_power_of_2(V))), USE_G=g is not None,
        IS_VARLEN=seqs.is_varlen,
        **constexprs, num_warps=num_warps,
    )  # fmt: skip
    return (t_inv, w, u, *scales) if row_scaled else (t_inv, w, u)


def wy_fwd(
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None,
    geo: ChunkGeometry,
    seqs: SequenceLayout,
    inter_dtype: torch.dtype = torch.float32,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (T [B,L,H,BT] in k's dtype, W [B,L,H,K], U [B,L,H,V]) for the L = T·n_h steps.

    W and U are fp32 by default (the state pass then does not round them to bf16); the ``lowp`` variant
    passes k's dtype, halving their HBM traffic in the forward and the state passes (FLA's choice).
    ``num_warps`` overrides the default 4 (variant key ``wywarps``).
    """
    return launch_block_transform(wy_fwd_kernel, k, v, beta, g, geo, seqs, inter_dtype, num_warps or 4)
