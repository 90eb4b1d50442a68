"""Register-light per-chunk gradients (the ``kslice`` variant): the kernels of ``grads.py`` with the head dim
K of q/k/W cut into BKS-column slices streamed in loops, so that one [BT, BKS] slice of a K-wide operand is
live at a time (``grads.py`` holds several [64, K] tiles at once: 255 registers per thread at K = 128).

Same launchers, arguments and results as ``grads.py`` (``chunk.py`` picks one of the two, ``block_k`` and
``max_registers`` are extra keywords); outputs agree with it up to fp32 rounding: sums over K are split
into per-slice partial sums and a few sums are added in another order, while every product takes its
operands in the dtypes ``grads.py`` gives them. K need not be a multiple of BKS (the last slice is masked).

* ``dqkw``: one V loop builds the K-independent dS = dO δᵀ and dSᵀ = δ dOᵀ (both ways, as ``grads.py``);
  a short K loop sums k qᵀ for the gate gradient of the intra-chunk scores; then, per K slice, a V loop
  accumulates that slice's dq, direct dk and ∂L/∂W, transposed ([BKS, ·]: the products then take the
  bf16 tiles from memory as first operand and the fp32 δ, dδ as second, with no operand tile in
  registers), which are finished with the slice's q and k and stored through transposed pointers.
* ``wy_bwd`` (kernel in ``wy_bwd_sliced.py``): the V part as in ``grads.py`` but building only (∂L/∂T)ᵀ; pass
  1 over K slices adds the W part of (∂L/∂T)ᵀ; (∂L/∂A)ᵀ = −T (∂L/∂T)ᵀ T as in ``grads.py``; a K loop sums k
  kᵀ; pass 2 over K slices recomputes Tᵀ·∂L/∂W for the slice (one [BT, BT]×[BT, BKS] product: no partial dk
  goes through memory, so the dk output is written once, from fp32) and adds the direct dk and the ∂L/∂A
  terms. ∂L/∂A is needed both ways round in pass 2; the transposed half is read back through transposed
  pointers from a [BT, BT] scratch (dk's own rows when K >= BT: nothing else writes them before pass 2), with
  a ``tl.debug_barrier()`` on each side (different threads own the elements).

Register notes (sm_90). At 8 warps, Triton gives a product whose result reaches another product through
SSA values all 8 warps along M (``warpsPerTileV3``'s "chained dot" rule): a 64-row tile is then computed by
both warp groups, twice the registers. So ∂L/∂A enters pass 2 from memory rather than from the registers
of its own product, and pass 2 starts its dk accumulator from the direct dk (``acc=``) rather than adding
a product result into the other product (Triton folds ``dot(a, b) + c`` into the accumulator).

No ``tl.trans`` (see ``grads.py``): transposed operands come through transposed pointers.
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
from titan_delta_kernels.gated_delta_product.wy_bwd_hoisted import wy_bwd_hoisted_kernel
from titan_delta_kernels.gated_delta_product.wy_bwd_sliced import wy_bwd_sliced_kernel

Tensor = torch.Tensor

# Width of a K slice: one slice at K <= 64, two at K = 128.
KSLICE_BLOCK_K = 64
# Offline sm_90a compiles (Triton 3.9; K = V = 128, n_h = 2, bf16 q/k/v, fp32 W/δ/dδ, 2 stages), registers
# and spill-stack bytes per thread. Uncapped, ptxas takes ~190-210 registers at 8 warps and 255 at 4
# (grads.py: 255 at both), so either way only 8 warps fit on an SM. Capped at 128 (``maxnreg``), 8 warps
# spill little (dqkw 88 B, wy_bwd 160 B of stack, no spill instruction in wy_bwd's loops) and 2 blocks =
# 16 warps fit per SM (shared memory 80 and 64 KiB per block); 4 warps capped at 128 spill 450-650 B.
# On an H200 (docs/benchmarks.md, GDP 22:16 UTC, sixth session) 4 warps without a cap were fastest, fwd+bwd at
# [4,4096,16,128] n_h = 2: grads.py 4.653 ms, 8 warps capped at 128 4.336, 8 uncapped 4.797, 4 warps 4.023;
# n_h = 3: 6.931 / 6.447 / 7.104 / 5.943 ms; [8,2048,16,64] n_h = 3: 4.132 / 3.105 / – / 2.955 ms. Hence 4
# warps by default; gwarps=8 gets the 128-register cap, gregs=N sets another (0: none).
KSLICE_NUM_WARPS = 4
KSLICE_MAX_REGISTERS = {8: 128}  # num_warps -> maxnreg, only for 64-step blocks (n_h <= 4)
# dqkw alone at 4 warps and K <= 64 (64-step blocks): uncapped it takes 232 registers, 2 blocks per SM; capped
# at 168 it spills 8 B and 3 fit (offline sm_90a compile, Triton 3.6). wy_bwd capped the same way spills
# 136 B, and on an H200 gregs=168 (both capped) took dqkw 0.404 -> 0.352 ms but wy_bwd 0.477 -> 0.492 ms at
# [8,2048,16,64], n_h = 2 (docs/benchmarks.md, GDP 00:44 UTC, seventh session). ``dqregs=N`` overrides it.
KSLICE_DQKW_MAX_REGISTERS = 168


@triton.jit
def dqkw_sliced_kernel(
    q, k, g, v_new, chunk_states, d_chunk_states, d_delta, d_out,
    dq, dk_part, dw, dG_step, dG_tok,
    cu_seqlens, chunk_offsets, T, NT, N, search_steps, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr,
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
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    if IS_VARLEN:  # noqa: SIM108 (a constexpr branch, not a runtime select)
        chunk_id = i_c + tl.load(chunk_offsets + seq)
    else:
        chunk_id = i_chunk
    h_base = (chunk_id.to(tl.int64) * H + i_h) * K * V
    # Scalar int64 row bases and int32 in-tile offsets (grads.py's per-element int64 rows cost registers).
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
    dt = chunk_states.dtype.element_ty  # grads.py's b_ht.dtype

    # dS = dO δᵀ [BC, BT] and dSᵀ = δ dOᵀ [BT, BC] do not depend on K (both built, as in grads.py).
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
        b_ds += tl.dot(b_do.to(dt), b_dt.to(dt))
        b_dst += tl.dot(b_d.to(dt), b_dot.to(dt))

    G, Gq, G_last = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    causal = ((o_s // NH)[None, :] <= o_t[:, None]) & m_t[:, None]
    b_dsd = tl.where(causal, b_ds * tl.exp(tl.where(causal, Gq[:, None] - G[None, :], 0.0)) * scale, 0.0)
    b_dsd = b_dsd.to(k.dtype.element_ty)
    causal_t = ((o_s // NH)[:, None] <= o_t[None, :]) & m_t[None, :]
    decay_t = tl.exp(tl.where(causal_t, Gq[None, :] - G[:, None], 0.0))
    b_dsd_t = tl.where(causal_t, b_dst * decay_t * scale, 0.0).to(q.dtype.element_ty)

    # Intra-chunk scores: a pair (query i, step r) moves +p to Gq_i and −p to G_r; same-token pairs are
    # dropped (see grads.py). Built transposed ([BT, BC], like dSᵀ), k qᵀ summed over all of K first.
    b_kq = tl.zeros([BT, BC], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BKS)):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = o_k < K
        b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
        b_qt = tl.load(q + q_rows[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_kq += tl.dot(b_k, b_qt)
    earlier_t = ((o_s // NH)[:, None] < o_t[None, :]) & m_t[None, :]  # e^{Gq_i − G_r}: output.masked_scores
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
            b_dqt += tl.dot(b_h, b_dot)
            b_dkt += tl.dot(b_dh, b_dt)
            b_dwt += tl.dot(b_h, b_ddt)
            b_dhh += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), 1)

        m_ks = m_k[:, None] & m_s[None, :]
        tl.store(dw + rows[None, :] * K + o_k[:, None], (-b_dwt).to(dw.dtype.element_ty), mask=m_ks)
        m_kt = m_k[:, None] & m_t[None, :]
        b_qt = tl.load(q + q_rows[None, :] * K + o_k[:, None], mask=m_kt, other=0.0)
        b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
        # Inter-chunk output term scale·e^{Gq} q S₀, then the intra-chunk scores' dq.
        b_dqt = b_dqt * q_decay[None, :]
        dGq += tl.sum(b_dqt * b_qt.to(tl.float32), 0)
        b_dqt += tl.dot(b_kt, b_dsd_t)
        tl.store(dq + q_rows[None, :] * K + o_k[:, None], b_dqt.to(dq.dtype.element_ty), mask=m_kt)
        # State update term e^{G_L − G_r} k_r δ_rᵀ and e^{G_L} S₀, then the scores' direct dk.
        b_dkt = b_dkt * k_decay[None, :]
        kdk += tl.sum(b_dkt * b_kt.to(tl.float32), 0)
        b_dkt += tl.dot(b_qt, b_dsd)
        tl.store(dk_part + rows[None, :] * K + o_k[:, None], b_dkt.to(dk_part.dtype.element_ty), mask=m_ks)

    kdk = tl.where(o_s // NH < n_tok - 1, kdk, 0.0)  # same cancellation
    dG -= kdk
    dG_last = tl.sum(b_dhh, 0) * tl.exp(G_last) + tl.sum(kdk, 0)
    dGq += tl.where(o_t == n_tok - 1, dG_last, 0.0)
    tl.store(dG_step + rows, dG, mask=m_s)
    tl.store(dG_tok + q_rows, dGq, mask=m_t)


def slice_width(K: int, block_k: int | None = None) -> int:
    """The K-slice width BKS: ``block_k`` (default ``KSLICE_BLOCK_K``), a power of two >= 16 (tl.dot),
    capped at K's own power-of-two block (K <= BKS is one slice, like ``grads.py``'s single tile)."""
    bks = KSLICE_BLOCK_K if block_k is None else block_k
    if bks < 16 or bks & (bks - 1):
        raise ValueError(f"the K-slice width must be a power of two >= 16, got {bks}")
    return min(bks, max(16, next_power_of_2(K)))


def _launch_config(k: Tensor, V: int, use_g: bool, geo: ChunkGeometry, seqs: SequenceLayout,
                   num_warps: int | None, block_k: int | None, max_registers: int | None,
                   dqkw_cap: bool = False) -> tuple[dict, tuple, tuple]:  # fmt: skip
    """Constexprs and launch options (grads._launch_config's with BKS for BK, and the register cap),
    sequence-layout arguments and grid shared by both kernels; ``dqkw_cap``: dqkw's default cap applies
    when no cap was given."""
    H, K = k.shape[2], k.shape[3]
    warps = num_warps or KSLICE_NUM_WARPS
    common = dict(
        H=H, K=K, V=V, NH=geo.num_householder, C=geo.tokens_per_chunk, BT=geo.block_steps,
        BC=geo.block_tokens, BKS=slice_width(K, block_k),
        BV=min(64, max(16, next_power_of_2(V))), USE_G=use_g, IS_VARLEN=seqs.is_varlen,
        num_warps=warps, num_stages=2 if K <= 128 else 1,
    )  # fmt: skip
    if max_registers is None and geo.block_steps <= 64:
        max_registers = KSLICE_MAX_REGISTERS.get(warps)
        if max_registers is None and dqkw_cap and warps == 4 and K <= 64:
            max_registers = KSLICE_DQKW_MAX_REGISTERS
    if max_registers:  # 0: no cap
        common["maxnreg"] = max_registers
    where = (seqs.cu_seqlens, seqs.chunk_offsets, seqs.tokens_per_sequence, seqs.chunks_per_sequence,
             seqs.num_sequences, seqs.search_steps)  # fmt: skip
    return common, where, (seqs.grid_chunks, H)


def dqkw(q: Tensor, k: Tensor, g: Tensor | None, v_new: Tensor, chunk_states: Tensor, d_chunk_states: Tensor,
         d_delta: Tensor, d_out: Tensor, scale: float, geo: ChunkGeometry, seqs: SequenceLayout,
         num_warps: int | None = None, block_k: int | None = None, max_registers: int | None = None,
         dk_part_dtype: torch.dtype | None = None,
         ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``grads.dqkw`` sliced over K: (dq, direct dk, ∂L/∂W, step and token log-gate gradients)."""
    B, L, H, K = k.shape
    f32 = dict(dtype=torch.float32, device=k.device)
    dq = torch.empty_like(q)
    # ∂L/∂W in k's dtype: wy_bwd reads it only rounded to that (same values, half the bytes); the direct dk,
    # which wy_bwd adds in fp32, in ``dk_part_dtype`` (default δ's: fp32 unless lowp or lowp_safe).
    dk_part = torch.empty(B, L, H, K, dtype=dk_part_dtype or v_new.dtype, device=k.device)
    dw = torch.empty(B, L, H, K, dtype=k.dtype, device=k.device)
    dG_step = torch.empty(B, L, H, **f32)
    dG_tok = torch.empty(*q.shape[:3], **f32)
    common, where, grid = _launch_config(
        k, d_delta.shape[-1], g is not None, geo, seqs, num_warps, block_k, max_registers, dqkw_cap=True
    )
    if v_new.element_size() < 4 and K > 64:
        # With a 16-bit δ (lowp, lowp_safe) and K = 128, Triton 3.6 on an H200 miscompiled this kernel's
        # software pipeline: ∂L/∂W off by 11-18% relative at n_h = 1 (2 stages) and at n_h = 1..3 (3 stages),
        # while dq and the direct dk were exact; with 1 stage every n_h was bitwise right (GPU probe,
        # docs/benchmarks.md, GDP, tenth session). Hence 1 stage there.
        common["num_stages"] = 1
    launch(
        dqkw_sliced_kernel, grid,
        q, k, k if g is None else g, v_new, chunk_states, d_chunk_states, d_delta, d_out,
        dq, dk_part, dw, dG_step, dG_tok, *where, scale, **common,
    )  # fmt: skip
    return dq, dk_part, dw, dG_step, dG_tok


def wy_bwd(k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, t_inv: Tensor, d_delta: Tensor,
           dk_part: Tensor, dw: Tensor, dG_step: Tensor, dG_tok: Tensor, geo: ChunkGeometry,
           seqs: SequenceLayout, num_warps: int | None = None, block_k: int | None = None,
           max_registers: int | None = None, num_stages: int | None = None,
           hoisted: bool = False) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:  # fmt: skip
    """``grads.wy_bwd`` sliced over K: (dk, dv, dg or None, dβ) in the dtypes of k, v, g, β. ``num_stages``
    overrides the pipelining depth of its K and V loops (variant key ``wystages``); ``hoisted`` (variant flag
    ``wyhoist``) takes ``wy_bwd_hoisted_kernel`` where K and V fit one slice and one V tile."""
    dk, dv, dbeta = torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
    dg = None if g is None else torch.empty_like(g)
    common, where, grid = _launch_config(
        k, v.shape[-1], g is not None, geo, seqs, num_warps, block_k, max_registers
    )
    common["num_stages"] = num_stages or wy_bwd_num_stages(k.shape[-1], common["BKS"])
    # The [BT, BT] scratch of each chunk: its own rows of dk when they are wide enough, else a buffer laid
    # out like T (the kernel reads it back before it writes dk).
    scr = dk if k.shape[-1] >= geo.block_steps else torch.empty(t_inv.shape, dtype=k.dtype, device=k.device)
    one_tile = k.shape[-1] <= common["BKS"] and v.shape[-1] <= common["BV"]
    launch(
        wy_bwd_hoisted_kernel if hoisted and one_tile else wy_bwd_sliced_kernel, grid,
        k, v, beta, k if g is None else g, t_inv, d_delta, dw, dk_part, dG_step, dG_tok, dk, dv, dbeta,
        dk if dg is None else dg, scr, *where, SCR=scr.shape[-1], **common,
    )  # fmt: skip
    return dk, dv, dg, dbeta


# wy_bwd's pipelining depth: 3 where its K loops run more than once (K = 128 in 64-column slices: on an H200
# wy_bwd went 1.007 -> 0.909 ms at [4,4096,16,128], n_h = 3, against 1.165 ms with 1 stage), 2 otherwise (at
# K = 64 one slice: 0.734-0.735 ms with 1, 2 or 3 stages at [8,2048,16,64], n_h = 3; docs/benchmarks.md, GDP,
# eleventh session).
WY_BWD_STAGES_MULTI_SLICE = 3


def wy_bwd_num_stages(head_dim: int, block_k: int) -> int:
    if head_dim > 128:
        return 1
    return WY_BWD_STAGES_MULTI_SLICE if head_dim > block_k else 2


def chunk_grads(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, t_inv: Tensor, v_new: Tensor,
    chunk_states: Tensor, d_chunk_states: Tensor, d_delta: Tensor, d_out: Tensor, scale: float,
    geo: ChunkGeometry, seqs: SequenceLayout, num_warps: int | None = None, block_k: int | None = None,
    max_registers: int | None = None, dqkw_max_registers: int | None = None, dqkw_block_k: int | None = None,
    dk_part_dtype: torch.dtype | None = None, wy_bwd_stages: int | None = None,
    wy_bwd_block_k: int | None = None, wy_bwd_hoisted: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:  # fmt: skip
    """``grads.chunk_grads`` with the K-sliced kernels: (dq, dk, dv, dg or None, dβ). ``max_registers``
    caps both kernels, ``dqkw_max_registers`` dqkw alone (None: the defaults; 0: no cap);
    ``dqkw_block_k`` and ``wy_bwd_block_k`` are the kernels' own slice widths (None: ``block_k``);
    ``wy_bwd_stages`` is wy_bwd's pipelining depth (None: ``wy_bwd_num_stages``); ``wy_bwd_hoisted`` its
    one-tile kernel with the loads issued first (``wy_bwd``'s ``hoisted``)."""
    launch = dict(num_warps=num_warps, block_k=block_k, max_registers=max_registers)
    dq_cap = max_registers if dqkw_max_registers is None else dqkw_max_registers
    dq, dk_part, dw, dG_step, dG_tok = dqkw(
        q, k, g, v_new, chunk_states, d_chunk_states, d_delta, d_out, scale, geo, seqs,
        num_warps=num_warps, block_k=block_k if dqkw_block_k is None else dqkw_block_k, max_registers=dq_cap,
        dk_part_dtype=dk_part_dtype,
    )
    launch["block_k"] = block_k if wy_bwd_block_k is None else wy_bwd_block_k
    dk, dv, dg, dbeta = wy_bwd(
        k, v, g, beta, t_inv, d_delta, dk_part, dw, dG_step, dG_tok, geo, seqs, **launch,
        num_stages=wy_bwd_stages, hoisted=wy_bwd_hoisted,
    )
    return dq, dk, dv, dg, dbeta
