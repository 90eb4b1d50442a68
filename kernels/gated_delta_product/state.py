"""The two sequential passes over chunks: forward states and reverse state gradients.

One program per (sequence, head, V-tile) walks its sequence's chunks in order; the V columns of the state
are independent, so tiling V is exact. Everything heavy per chunk (UT transform, outputs, local gradients)
runs in the parallel per-chunk kernels; these passes only carry the [K, BV] state (fp32) across chunks.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.gated_delta_product._common import (
    ChunkGeometry,
    SequenceLayout,
    chunk_log_gates,
    scaled_f16,
    sequence_bounds,
)
from titan_delta_kernels.gated_delta_product.state_bwd_lean import state_bwd_lean_kernel
from titan_delta_kernels.gated_delta_product.state_lean import state_fwd_lean_kernel


@triton.jit
def state_fwd_kernel(
    k, w, u, w_scale, u_scale, g, h0, chunk_states, v_new, final_state,
    cu_seqlens, chunk_offsets, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr, W_PLANES: tl.constexpr,
    FWD16: tl.constexpr, ROW_SCALED: tl.constexpr,
):  # fmt: skip
    """Stores the state entering each chunk and δ = U − W S for it; writes the final state.

    ``ROW_SCALED`` (``w16``): W and U come in fp16 with one power-of-two scale per row (``w_scale``,
    ``u_scale``). W is widened to fp32 for the default's tf32 product (exact: fp16 carries tf32's 11 bits)
    and the product's rows are unscaled, folded into δ's subtraction.

    ``FWD16`` (fp32 W only; bit 1: W·S, bit 2: Kᵀδ): that product takes scaled fp16 operands (``scaled_f16``:
    one power of two per row of the first and per column of the second), the same 11-bit significands as the
    default's tf32 at twice the tensor-core rate.

    ``W_PLANES``: W comes as 16-bit planes (``split_planes``), each row [hi | lo], added back to fp32 for the
    default's tf32 products. (Three 16-bit products hi·S_hi + hi·S_lo + lo·S_hi instead were slower on an
    H200: 0.429 -> 0.481 ms at [4,4096,16,128], n_h = 2; docs/benchmarks.md, GDP 05:04 UTC, ninth session.)
    """
    i_seq, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk = sequence_bounds(i_seq, cu_seqlens, chunk_offsets, T, NT, IS_VARLEN)
    o_s = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    state_off = ((i_seq * H + i_h) * K + o_k[:, None]).to(tl.int64) * V + o_v[None, :]
    if USE_H0:
        b_h = tl.load(h0 + state_off, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    n_chunks = tl.cdiv(eos - bos, C)
    for i_c in range(0, n_chunks):
        tok0 = bos + i_c * C
        n_tok = tl.minimum(C, eos - tok0)
        m_s = o_s < n_tok * NH
        rows = (tok0.to(tl.int64) * NH + o_s) * H + i_h
        h_off = (((first_chunk + i_c).to(tl.int64) * H + i_h) * K + o_k[:, None]) * V + o_v[None, :]
        tl.store(chunk_states + h_off, b_h.to(chunk_states.dtype.element_ty), mask=m_kv)

        m_sk = m_s[:, None] & (o_k < K)[None, :]
        m_sv = m_s[:, None] & (o_v < V)[None, :]
        b_u = tl.load(u + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0).to(tl.float32)
        if ROW_SCALED:
            b_u = b_u * tl.load(u_scale + rows, mask=m_s, other=0.0)[:, None]
            w_unscale = tl.load(w_scale + rows, mask=m_s, other=0.0)
        if W_PLANES:  # W = hi + lo back in fp32 (exact to ~2^-16), then the default's tf32 product
            w_row = w + rows[:, None] * (2 * K) + o_k[None, :]
            b_w = tl.load(w_row, mask=m_sk, other=0.0).to(tl.float32)
            b_w += tl.load(w_row + K, mask=m_sk, other=0.0).to(tl.float32)
        else:
            b_w = tl.load(w + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
        # Products in W's dtype: fp32 by default (tf32 on tensor cores); with ``lowp`` W is bf16 and the state
        # is rounded to bf16 for the product (what FLA does).
        if ROW_SCALED:  # tf32 (not FWD16: the operand rows are scaled already)
            b_w = b_w.to(tl.float32)
            b_delta = b_u - tl.dot(b_w, b_h) * w_unscale[:, None]
        elif FWD16 % 2 == 1:
            w16, w_unscale = scaled_f16(b_w, 1)
            h16, h_unscale = scaled_f16(b_h, 0)
            b_delta = b_u - tl.dot(w16, h16) * w_unscale[:, None] * h_unscale[None, :]
        else:
            b_delta = b_u - tl.dot(b_w, b_h.to(b_w.dtype))
        tl.store(v_new + rows[:, None] * V + o_v[None, :], b_delta.to(v_new.dtype.element_ty), mask=m_sv)

        G, _, G_last = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
        m_ks = (o_k < K)[:, None] & m_s[None, :]
        b_kt = tl.load(k + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
        b_delta = b_delta * tl.exp(G_last - G)[:, None]
        if FWD16 // 2 == 1:
            kt16, k_unscale = scaled_f16(b_kt.to(tl.float32), 1)
            d16, d_unscale = scaled_f16(b_delta, 0)
            b_h = b_h * tl.exp(G_last) + tl.dot(kt16, d16) * k_unscale[:, None] * d_unscale[None, :]
        else:
            b_h = b_h * tl.exp(G_last) + tl.dot(b_kt.to(b_w.dtype), b_delta.to(b_w.dtype))
    tl.store(final_state + state_off, b_h, mask=m_kv)


@triton.jit
def state_bwd_kernel(
    q, k, w, w_scale, g, d_out, d_final, d_vlocal, d_chunk_states, d_delta, d_h0,
    cu_seqlens, chunk_offsets, T, NT, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_DHT: tl.constexpr, IS_VARLEN: tl.constexpr, WT_MODE: tl.constexpr,
    SPLIT_DTYPE: tl.constexpr, W_PLANES: tl.constexpr, ROW_SCALED: tl.constexpr,
):  # fmt: skip
    """Reverse pass: stores ∂L/∂(state leaving each chunk) and the total ∂L/∂δ; writes ∂L/∂initial_state.

    ``WT_MODE`` picks the operands of the product Wᵀ·dδ (see ``WT_MODES``): 0 in W's dtype (tf32 for fp32 W),
    1 both rounded to k's dtype, 3 the fp32 product as three SPLIT_DTYPE (bf16) products hi·hi + hi·lo +
    lo·hi, 4 one product of scaled fp16 operands (``scaled_f16``). With ``W_PLANES`` (W as 16-bit planes,
    ``split_planes``) Wᵀ·dδ is mode 3's three products whatever ``WT_MODE`` says, with W's halves loaded
    rather than split in registers. ``ROW_SCALED`` (``w16``): W comes in fp16 with a power-of-two scale per
    row (``w_scale``), rebuilt in fp32 (exactly) before the mode's product.
    """
    i_seq, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk = sequence_bounds(i_seq, cu_seqlens, chunk_offsets, T, NT, IS_VARLEN)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    state_off = ((i_seq * H + i_h) * K + o_k[:, None]).to(tl.int64) * V + o_v[None, :]
    if USE_DHT:
        b_dh = tl.load(d_final + state_off, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    n_chunks = tl.cdiv(eos - bos, C)
    for i_rev in range(0, n_chunks):
        i_c = n_chunks - 1 - i_rev
        tok0 = bos + i_c * C
        n_tok = tl.minimum(C, eos - tok0)
        m_s = o_s < n_tok * NH
        m_t = o_t < n_tok
        rows = (tok0.to(tl.int64) * NH + o_s) * H + i_h
        q_rows = (tok0.to(tl.int64) + o_t) * H + i_h
        h_off = (((first_chunk + i_c).to(tl.int64) * H + i_h) * K + o_k[:, None]) * V + o_v[None, :]
        tl.store(d_chunk_states + h_off, b_dh.to(d_chunk_states.dtype.element_ty), mask=m_kv)

        G, Gq, G_last = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
        m_sk = m_s[:, None] & (o_k < K)[None, :]
        m_sv = m_s[:, None] & (o_v < V)[None, :]
        b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_sk, other=0.0)
        b_dd = tl.load(d_vlocal + rows[:, None] * V + o_v[None, :], mask=m_sv, other=0.0).to(tl.float32)
        b_dd += tl.dot(b_k, b_dh.to(b_k.dtype)) * tl.exp(G_last - G)[:, None]
        tl.store(d_delta + rows[:, None] * V + o_v[None, :], b_dd.to(d_delta.dtype.element_ty), mask=m_sv)

        m_kt = (o_k < K)[:, None] & m_t[None, :]
        b_qt = tl.load(q + q_rows[None, :] * K + o_k[:, None], mask=m_kt, other=0.0)
        b_do = tl.load(d_out + q_rows[:, None] * V + o_v[None, :], mask=m_t[:, None] & (o_v < V)[None, :],
                       other=0.0)  # fmt: skip
        b_do = (b_do.to(tl.float32) * (scale * tl.exp(Gq))[:, None]).to(b_qt.dtype)
        m_ks = (o_k < K)[:, None] & m_s[None, :]
        if W_PLANES:
            w_hi = tl.load(w + rows[None, :] * (2 * K) + o_k[:, None], mask=m_ks, other=0.0)
            w_lo = tl.load(w + rows[None, :] * (2 * K) + K + o_k[:, None], mask=m_ks, other=0.0)
            d_hi = b_dd.to(w_hi.dtype)
            d_lo = (b_dd - d_hi.to(tl.float32)).to(w_hi.dtype)
            b_wdd = tl.dot(w_lo, d_hi, tl.dot(w_hi, d_lo, tl.dot(w_hi, d_hi)))
        else:
            b_wt = tl.load(w + rows[None, :] * K + o_k[:, None], mask=m_ks, other=0.0)
            if ROW_SCALED:
                b_wt = b_wt.to(tl.float32) * tl.load(w_scale + rows, mask=m_s, other=0.0)[None, :]
            if WT_MODE == 1:
                b_wdd = tl.dot(b_wt.to(b_k.dtype), b_dd.to(b_k.dtype))
            elif WT_MODE == 3:
                w_hi = b_wt.to(SPLIT_DTYPE)
                w_lo = (b_wt.to(tl.float32) - w_hi.to(tl.float32)).to(SPLIT_DTYPE)  # the difference is exact
                d_hi = b_dd.to(SPLIT_DTYPE)
                d_lo = (b_dd - d_hi.to(tl.float32)).to(SPLIT_DTYPE)
                b_wdd = tl.dot(w_lo, d_hi, tl.dot(w_hi, d_lo, tl.dot(w_hi, d_hi)))
            elif WT_MODE == 4:
                wt16, w_unscale = scaled_f16(b_wt.to(tl.float32), 1)
                dd16, d_unscale = scaled_f16(b_dd, 0)
                b_wdd = tl.dot(wt16, dd16) * w_unscale[:, None] * d_unscale[None, :]
            else:
                b_wdd = tl.dot(b_wt, b_dd.to(b_wt.dtype))
        b_dh = b_dh * tl.exp(G_last) + tl.dot(b_qt, b_do) - b_wdd
    tl.store(d_h0 + state_off, b_dh, mask=m_kv)


# Operands of state_bwd's Wᵀ·dδ for fp32 W. With 0 (the default path) it is a tf32 wgmma, whose operands must
# be K-major (here: steps contiguous) in shared memory; W is stored [steps, K] with K contiguous, so Triton's
# pipeliner copies the 128×64 fp32 Wᵀ tile with 4-byte cp.async (64 per thread per chunk at K = 128, 4 warps,
# instead of 8 16-byte ones for bf16 W, which bf16 wgmma takes MN-major) — this, not the bytes, made lowp's
# state_bwd 3.4× faster on an H200 (docs, "Why lowp's state_bwd is fast"). 1 and 3 load fp32 Wᵀ with 16-byte
# cp.async into a plain swizzled buffer and feed 16-bit wgmma operands from registers.
WT_MODES = {
    0: "W's dtype (tf32 for fp32 W)",
    1: "Wᵀ and dδ rounded to k's dtype, fp32 accumulation (lowp_state)",
    3: "three bf16 products hi·hi + hi·lo + lo·hi: ~2^-16 relative, tighter than tf32 (bf16x3)",
    4: "one fp16 product, Wᵀ scaled per row and dδ per column by powers of two: tf32's 11 bits (wd16)",
}

# The state passes are sequential over chunks, so their speed is set by how many programs share the GPU:
# narrow V tiles give N·H·V/BV programs (twice as many with 32 as with 64).
STATE_BLOCK_V = 32
STATE_NUM_WARPS = 4
# The reverse pass at n_h = 1 (64-token chunks: twice the q and dO rows of n_h = 2) needs 119-123 KB of shared
# memory with 32-column V tiles, so one block fits per SM and its N·H·V/32 programs ran in two waves at the
# issue's shapes. 64-column tiles halve the programs to one wave: [4,4096,16,128] 0.523 -> 0.385 ms, [8,2048,
# 16,64] 0.140 -> 0.094 ms, bitwise the same results (H200 probe, docs/benchmarks.md, GDP 02:16-02:21 UTC,
# eighth session). At n_h = 2 and 3 they were slower (0.619 -> 0.757, 0.813 -> 1.276 ms at K = 128).
STATE_BWD_BLOCK_V_NH1 = 64


# With W as planes the reverse pass at 64 columns was faster than at 32 on an H200 (0.584 -> 0.466 ms at
# [4,4096,16,128], n_h = 2; 0.247 -> 0.208 ms at [8,2048,16,64], n_h = 3; 0.761 -> 0.757 ms at n_h = 3,
# K = 128; docs/benchmarks.md, GDP 05:04 UTC, ninth session), where fp32 W at 64 columns was slower (0.619 ->
# 0.757 ms, eighth session).
STATE_BWD_BLOCK_V_PLANES = 64


# With W and U as row-scaled fp16 (``w16``) at K <= 64 the forward pass takes 64-column tiles. H200 state_fwd
# at [8,2048,16,64], n_h = 3: 0.226 ms (fp32 W, 32 columns), w16 0.269 (32) / 0.200 (64), w16+lowp_safe
# 0.229 (32) / 0.190 (64). At K = 128 it was mixed: w16 0.493 (32) / 0.424 (64) but w16+lowp_safe 0.463 (32) /
# 0.505 (64) at [4,4096,16,128], n_h = 2, and 0.690 / 0.759 at n_h = 3, so 32 there (docs/benchmarks.md, GDP,
# eleventh session). The reverse pass stays at 32 columns (w16 at 64 was slower there: 0.784 against 0.484
# ms).
STATE_FWD_BLOCK_V_ROW_SCALED = 64


def _bwd_block_v(num_householder: int, planes: bool = False) -> int:
    if planes:
        return STATE_BWD_BLOCK_V_PLANES
    return STATE_BWD_BLOCK_V_NH1 if num_householder == 1 else STATE_BLOCK_V


def _stages(BK: int) -> int:
    """Software-pipelining depth of the chunk loop: with 3 stages the reverse pass needed 238 KB of shared
    memory at K = 128 on an H200 (Triton 3.6; limit 227 KB), so 2 there and 1 beyond. At K ≤ 64, 3 stages
    took state_fwd 0.281 -> 0.244 ms and state_bwd 0.302 -> 0.259 ms at [8,2048,16,64], n_h = 3 (H200 sweep,
    docs/benchmarks.md, 2026-11-22 00:15 UTC)."""
    return 3 if BK <= 64 else 2 if BK <= 128 else 1


# The short-loop forward pass (``state_lean.py``) on an H200, ms at [4,4096,16,128], n_h = 3 / 2 / 1: the
# default kernel 0.688 / 0.462 / 0.258; lean 0.649 / 0.432 / 0.245; lean with W·S in fp16 (``sfs16``) 0.642 /
# 0.429 / 0.233, and with 3 pipeline stages 0.562 / 0.380 / 0.209 (95 KB of shared memory at K = 128: 2 blocks
# still fit per SM). At [8,2048,16,64] (K = 64, 64-column tiles, 3 stages already) fp16 W·S was slower:
# 0.190 -> 0.211 ms at n_h = 3 (docs/benchmarks.md, GDP, twelfth session), so ``sfs16`` acts from K = 128.
LEAN_FWD_STAGES = 3
LEAN_S16_MIN_K = 128


def _split_dtype() -> tl.dtype:
    """bf16 for WT_MODE 3; fp16 under the CPU interpreter, whose bf16 tl.dot returns garbage (Triton 3.9: a
    16×16 product off by ~1e10) and whose fp32 -> bf16 cast does not round to nearest: there the tests can
    check the split's algebra, and the GPU tests its bf16 form."""
    return tl.float16 if os.environ.get("TRITON_INTERPRET") == "1" else tl.bfloat16


def plane_dtype() -> torch.dtype:
    """Dtype of W's planes: ``_split_dtype`` as a torch dtype (bf16; fp16 under the CPU interpreter)."""
    return torch.float16 if os.environ.get("TRITON_INTERPRET") == "1" else torch.bfloat16


def split_planes(w: torch.Tensor) -> torch.Tensor:
    """fp32 W [..., K] -> [..., 2K] in ``plane_dtype``: each row is [hi | lo] with hi = W rounded and
    lo = W − hi rounded (hi + lo carries ~16 bits). The ``wplanes`` variant stores W this way: the reverse
    pass then feeds bf16x3's 16-bit products straight from memory (instead of splitting fp32 W in registers),
    and the forward pass adds the halves back to fp32 for its tf32 product."""
    hi = w.to(plane_dtype())
    return torch.cat([hi, (w - hi.float()).to(hi.dtype)], dim=-1)


def is_planes(w: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether W comes as planes (``split_planes``): twice k's last dim."""
    return w.shape[-1] == 2 * k.shape[-1]


def _check_row_scaled(x: torch.Tensor, x_scale: torch.Tensor | None, name: str) -> bool:
    """Whether ``x`` comes row-scaled (``w16``): fp16 with [B, L, H] fp32 factors; raises on a mismatch."""
    if x_scale is None:
        return False
    if x.dtype != torch.float16 or x_scale.dtype != torch.float32 or x_scale.shape != x.shape[:-1]:
        raise ValueError(
            f"row-scaled {name} must be fp16 with fp32 scales of shape {tuple(x.shape[:-1])}, "
            f"got {name} {x.dtype} and scales {x_scale.dtype} {tuple(x_scale.shape)}"
        )
    return True


def _blocks(K: int, V: int, block_v: int | None) -> tuple[int, int]:
    BV = block_v or STATE_BLOCK_V
    return max(16, next_power_of_2(K)), min(BV, max(16, next_power_of_2(V)))


def state_fwd(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    g: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    geo: ChunkGeometry,
    seqs: SequenceLayout,
    block_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    delta_dtype: torch.dtype | None = None,
    fwd16: int = 0,
    w_scale: torch.Tensor | None = None,
    u_scale: torch.Tensor | None = None,
    lean: bool = False,
    lean_s16: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (chunk-start states [chunks,H,K,V] in k's dtype, δ, final state [N,H,K,V] fp32).

    ``block_v``, ``num_warps``, ``num_stages`` override the defaults (the benchmark sweeps them). δ is stored
    in ``delta_dtype`` (default: u's dtype; the ``lowp_safe`` variant stores it in k's dtype with fp32 U);
    the products of the pass follow W's dtype either way (fp32 for W as planes, ``split_planes``).

    ``fwd16`` (0-3, the kernel's ``FWD16`` bits: 1 W·S, 2 Kᵀδ) takes scaled fp16 operands for those products;
    only for 16-bit inputs, as ``state_bwd``'s ``wt_mode``; bit 1 only for fp32 W (with row-scaled W, W·S is
    that storage's own tf32 product).

    ``w_scale`` and ``u_scale`` (both or neither; the ``w16`` variant): W and U are fp16 with one
    power-of-two scale per row, these [B, L, H] fp32 factors (``_common.row_scaled_f16``).

    ``lean`` (the ``sflean`` variant) runs ``state_lean.state_fwd_lean_kernel`` (same results, less integer
    work per chunk) where it applies: no planes, no ``fwd16`` product, K a power of two, V a multiple of the
    V tile; elsewhere this kernel. With it, ``lean_s16`` (row-scaled W, K >= ``LEAN_S16_MIN_K``) multiplies
    W·S in fp16, the state scaled per column by powers of two (``scaled_f16``). The lean kernel pipelines
    ``LEAN_FWD_STAGES`` chunks unless ``num_stages`` says otherwise.
    """
    if fwd16 not in (0, 1, 2, 3):
        raise ValueError(f"fwd16 must be 0..3 (bit 1: W·S, bit 2: Kᵀδ), got {fwd16}")
    row_scaled = _check_row_scaled(w, w_scale, "W") | _check_row_scaled(u, u_scale, "U")
    if row_scaled and (w_scale is None or u_scale is None):
        raise ValueError("state_fwd: w_scale and u_scale go together (W and U are both row-scaled fp16)")
    if (w.dtype != torch.float32 or k.dtype == torch.float32) and not row_scaled:
        fwd16 = 0
    _, _, H, K = k.shape
    V = u.shape[-1]
    BK, BV = _blocks(K, V, block_v or (STATE_FWD_BLOCK_V_ROW_SCALED if row_scaled and K <= 64 else None))
    chunk_states = k.new_empty(seqs.grid_chunks, H, K, V)
    v_new = torch.empty_like(u, dtype=delta_dtype or (torch.float32 if row_scaled else u.dtype))
    final_state = torch.empty(seqs.num_sequences, H, K, V, dtype=torch.float32, device=k.device)
    grid = (seqs.num_sequences, H, cdiv(V, BV))
    fwd16 = fwd16 & 2 if row_scaled else fwd16
    args = (
        k, w, u, k if w_scale is None else w_scale, k if u_scale is None else u_scale,
        k if g is None else g, k if initial_state is None else initial_state,
        chunk_states, v_new, final_state,
        seqs.cu_seqlens, seqs.chunk_offsets, seqs.tokens_per_sequence, seqs.chunks_per_sequence,
    )  # fmt: skip
    shared = dict(H=H, K=K, V=V, NH=geo.num_householder, C=geo.tokens_per_chunk, BT=geo.block_steps,
                  BC=geo.block_tokens, BV=BV, USE_G=g is not None, USE_H0=initial_state is not None,
                  IS_VARLEN=seqs.is_varlen, ROW_SCALED=row_scaled, num_warps=num_warps or STATE_NUM_WARPS)
    if lean and fwd16 == 0 and not is_planes(w, k) and BK == K and V % BV == 0:
        s16 = lean_s16 and row_scaled and K >= LEAN_S16_MIN_K
        stages = num_stages or LEAN_FWD_STAGES
        launch(state_fwd_lean_kernel, grid, *args, **shared, S16=s16, num_stages=stages)
    else:
        launch(state_fwd_kernel, grid, *args, **shared, BK=BK, W_PLANES=is_planes(w, k), FWD16=fwd16,
               num_stages=num_stages or _stages(BK))  # fmt: skip
    return chunk_states, v_new, final_state


def state_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    g: torch.Tensor | None,
    d_out: torch.Tensor,
    d_final: torch.Tensor | None,
    d_vlocal: torch.Tensor,
    scale: float,
    geo: ChunkGeometry,
    seqs: SequenceLayout,
    block_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    wt_mode: int = 0,
    w_scale: torch.Tensor | None = None,
    lean_w16: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (∂L/∂chunk-end states [chunks,H,K,V], total ∂L/∂δ [like d_vlocal, in k's dtype], ∂L/∂S₀
    [N,H,K,V] fp32).

    ∂L/∂δ is stored in k's dtype because both its readers (dqkw and wy_bwd, in ``grads.py`` and
    ``grads_sliced.py``) round it to k's dtype on load: storing it rounded gives them the same values for
    half the bytes. The pass itself uses the fp32 value (its Wᵀ·dδ product).

    W as planes (``split_planes``) gives Wᵀ·dδ as bf16x3's three products whatever ``wt_mode`` says.

    ``block_v`` etc. as in ``state_fwd``; the default V tile is 64 at n_h = 1 (``STATE_BWD_BLOCK_V_NH1``).

    ``wt_mode`` (``WT_MODES``) picks the operands of Wᵀ·dδ; it only matters for fp32 W from 16-bit inputs
    (1 and 3 give 0's kernel for 16-bit W and for fp32 inputs).

    ``w_scale`` (the ``w16`` variant): W is fp16 with one power-of-two scale per row, these [B, L, H] fp32
    factors; the modes then act on W rebuilt in fp32.

    ``lean_w16`` (``sbw16``) runs ``state_bwd_lean.state_bwd_lean_kernel`` (a short chunk loop with Wᵀ·dδ as
    one fp16 product, whatever ``wt_mode`` says) where it applies: row-scaled W, K a power of two, V a
    multiple of the V tile; elsewhere this kernel.
    """
    if wt_mode not in WT_MODES:
        raise ValueError(f"wt_mode must be one of {tuple(WT_MODES)}, got {wt_mode}")
    row_scaled = _check_row_scaled(w, w_scale, "W")
    if (w.dtype != torch.float32 or k.dtype == torch.float32) and not row_scaled:
        # 16-bit W is a 16-bit operand already; fp32 inputs keep fp32 operands: bf16x3 (now in the default)
        # is measured and GPU-tested for 16-bit inputs, and its 16-bit halves lack fp32's exponent range
        # under the CPU interpreter (fp16 there), where the fp32 tests check the default path at 1e-5
        wt_mode = 0
    _, _, H, K = k.shape
    V = d_vlocal.shape[-1]
    BK, BV = _blocks(K, V, block_v or _bwd_block_v(geo.num_householder, is_planes(w, k)))
    d_chunk_states = k.new_empty(seqs.grid_chunks, H, K, V)
    d_delta = torch.empty_like(d_vlocal, dtype=k.dtype)
    d_h0 = torch.empty(seqs.num_sequences, H, K, V, dtype=torch.float32, device=k.device)
    grid = (seqs.num_sequences, H, cdiv(V, BV))
    args = (
        q, k, w, k if w_scale is None else w_scale, k if g is None else g, d_out,
        k if d_final is None else d_final, d_vlocal,
        d_chunk_states, d_delta, d_h0,
        seqs.cu_seqlens, seqs.chunk_offsets, seqs.tokens_per_sequence, seqs.chunks_per_sequence, scale,
    )  # fmt: skip
    shared = dict(H=H, K=K, V=V, NH=geo.num_householder, C=geo.tokens_per_chunk, BT=geo.block_steps,
                  BC=geo.block_tokens, BV=BV, USE_G=g is not None, USE_DHT=d_final is not None,
                  IS_VARLEN=seqs.is_varlen, num_warps=num_warps or STATE_NUM_WARPS,
                  num_stages=num_stages or _stages(BK))  # fmt: skip
    if lean_w16 and row_scaled and BK == K and V % BV == 0:
        launch(state_bwd_lean_kernel, grid, *args, **shared)
    else:
        launch(state_bwd_kernel, grid, *args, **shared, BK=BK, WT_MODE=wt_mode, SPLIT_DTYPE=_split_dtype(),
               W_PLANES=is_planes(w, k), ROW_SCALED=row_scaled)  # fmt: skip
    return d_chunk_states, d_delta, d_h0
    launch(
        state_bwd_kernel, grid,
        q, k, w, k if w_scale is None else w_scale, k if g is None else g, d_out,
        k if d_final is None else d_final, d_vlocal,
        d_chunk_states, d_delta, d_h0,
        seqs.cu_seqlens, seqs.chunk_offsets, seqs.tokens_per_sequence, seqs.chunks_per_sequence, scale,
        H=H, K=K, V=V, NH=geo.num_householder, C=geo.tokens_per_chunk, BT=geo.block_steps,
        BC=geo.block_tokens, BK=BK, BV=BV, USE_G=g is not None, USE_DHT=d_final is not None,
        IS_VARLEN=seqs.is_varlen, WT_MODE=wt_mode, SPLIT_DTYPE=_split_dtype(), W_PLANES=is_planes(w, k),
        ROW_SCALED=row_scaled, num_warps=num_warps or STATE_NUM_WARPS, num_stages=num_stages or _stages(BK),
    )  # fmt: skip
    return d_chunk_states, d_delta, d_h0
