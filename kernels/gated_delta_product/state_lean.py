"""The forward state pass with a short chunk loop (``sflean``, in the default): ``state.state_fwd_kernel``'s
algorithm for W in fp32, 16-bit or row-scaled fp16 (``w16``), with the per-chunk integer work taken out, the
products issued early, 3 pipeline stages, and (``sfs16``, row-scaled W) W·S as an fp16 product.

* Every tile offset is an int32 tensor built once before the loop (rows of W, k and U are H·K or H·V apart
  within a head), and only four scalar int64 bases move per chunk: ~1000 -> ~750 SASS instructions per warp
  and chunk (offline sm_90a, [4,4096,16,128], n_h = 3), which alone did not change the time (0.692 -> 0.690 ms
  on an H200): the pass is bound by its chain S -> W·S -> δ -> Kᵀδ -> S, not by issue.
* Chunks are either full (rows masked only where the 64-step block has padding rows, C·n_h < BT: a mask
  that does not change across chunks) or the one partial chunk at a sequence's end, which takes the masked
  copy of the step (``PARTIAL``).
* What shortened the chain: 3 stages (``state.LEAN_FWD_STAGES``: chunk c+1's loads were issued at the end of
  chunk c and awaited first thing in c+1), and W·S in fp16 (``S16``): half the chained MMA steps of tf32 and
  W straight from shared memory instead of widened in registers (docs/kernels_gated_delta_product.md,
  twelfth session).

Without ``S16`` the results are bitwise ``state_fwd_kernel``'s (the same products, operands and dtypes).
"""

from __future__ import annotations

import triton
import triton.language as tl

from titan_delta_kernels.gated_delta_product._common import chunk_log_gates, scaled_f16, sequence_bounds


@triton.jit
def _load(ptr, mask, PARTIAL: tl.constexpr, ROWS_FULL: tl.constexpr):
    """A tile load masked only where it can reach past the chunk (see the module docstring)."""
    if PARTIAL or not ROWS_FULL:
        return tl.load(ptr, mask=mask, other=0.0)
    return tl.load(ptr)


@triton.jit
def _store(ptr, value, mask, PARTIAL: tl.constexpr, ROWS_FULL: tl.constexpr):
    if PARTIAL or not ROWS_FULL:
        tl.store(ptr, value, mask=mask)
    else:
        tl.store(ptr, value)


@triton.jit
def _chunk_step(
    b_h, k_c, w_c, u_c, ws_c, us_c, h_c, d_c, g, tok0, n_tok, i_h, H,
    off_sk, off_ks, off_sv, off_kv, o_s,
    NH: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, USE_G: tl.constexpr, ROW_SCALED: tl.constexpr,
    S16: tl.constexpr, PARTIAL: tl.constexpr, ROWS_FULL: tl.constexpr,
):  # fmt: skip
    """One chunk: store its entry state, δ = U − W S, and return the state leaving it.

    Each product is issued as soon as its operands exist and the work that does not need its result (the
    state and δ stores, gates, loads, casts) follows it. Triton waits for a dot right after issuing it, so
    this overlaps nothing within a warp; measured, it took the pass without ``S16`` 0.690 -> 0.649 ms and the
    one with it 0.602 -> 0.642 (3 stages: 0.562) at [4,4096,16,128], n_h = 3 on an H200.
    """
    m_s = o_s < n_tok * NH  # all true for full chunks when C·n_h == BT (then never used)
    b_w = _load(w_c + off_sk, m_s[:, None], PARTIAL, ROWS_FULL)
    if S16:  # fp16 W as stored · the state scaled per column to fp16: tf32's 11 bits, no widening of W
        h16, h_unscale = scaled_f16(b_h, 0)
        b_wh = tl.dot(b_w, h16)
    elif ROW_SCALED:
        b_wh = tl.dot(b_w.to(tl.float32), b_h)
    else:
        b_wh = tl.dot(b_w, b_h.to(b_w.dtype))
    tl.store(h_c + off_kv, b_h.to(h_c.dtype.element_ty))
    G, _, G_last = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    decay = tl.exp(G_last - G)
    b_u = _load(u_c + off_sv, m_s[:, None], PARTIAL, ROWS_FULL).to(tl.float32)
    wt = tl.float32 if ROW_SCALED else b_w.dtype
    b_kt = _load(k_c + off_ks, m_s[None, :], PARTIAL, ROWS_FULL).to(wt)
    b_h = b_h * tl.exp(G_last)
    if ROW_SCALED:
        b_u = b_u * _load(us_c + o_s * H, m_s, PARTIAL, ROWS_FULL)[:, None]
        w_unscale = _load(ws_c + o_s * H, m_s, PARTIAL, ROWS_FULL)
        if S16:
            b_delta = b_u - b_wh * w_unscale[:, None] * h_unscale[None, :]
        else:
            b_delta = b_u - b_wh * w_unscale[:, None]
    else:
        b_delta = b_u - b_wh
    b_h = tl.dot(b_kt, (b_delta * decay[:, None]).to(wt), b_h)
    _store(d_c + off_sv, b_delta.to(d_c.dtype.element_ty), m_s[:, None], PARTIAL, ROWS_FULL)
    return b_h


@triton.jit
def state_fwd_lean_kernel(
    k, w, u, w_scale, u_scale, g, h0, chunk_states, v_new, final_state,
    cu_seqlens, chunk_offsets, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr, ROW_SCALED: tl.constexpr,
    S16: tl.constexpr,
):  # fmt: skip
    """``state.state_fwd_kernel`` for W fp32, 16-bit or row-scaled fp16, K a power of two, BV dividing V."""
    i_seq, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk = sequence_bounds(i_seq, cu_seqlens, chunk_offsets, T, NT, IS_VARLEN)
    o_s = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, BV)
    # int32 offsets inside a chunk's tiles, built once: a head's consecutive steps are H rows apart.
    off_sk = o_s[:, None] * (H * K) + o_k[None, :]
    off_ks = o_s[None, :] * (H * K) + o_k[:, None]
    off_sv = o_s[:, None] * (H * V) + o_v[None, :]
    off_kv = o_k[:, None] * V + o_v[None, :]
    state0 = ((i_seq * H + i_h) * K).to(tl.int64) * V + i_v * BV
    if USE_H0:  # noqa: SIM108 (a constexpr branch, not a runtime select)
        b_h = tl.load(h0 + state0 + off_kv).to(tl.float32)
    else:
        b_h = tl.zeros([K, BV], dtype=tl.float32)
    n_tok_all = eos - bos
    n_full = n_tok_all // C
    row0 = bos.to(tl.int64) * NH * H + i_h  # the head's first step row, int64 (scalar)
    h0_row = (first_chunk.to(tl.int64) * H + i_h) * K  # the first chunk state's first row
    ROWS_FULL: tl.constexpr = C * NH == BT
    for i_c in range(0, n_full):
        row = row0 + i_c * (C * NH * H)
        b_h = _chunk_step(
            b_h, k + row * K, w + row * K, u + row * V + i_v * BV, w_scale + row, u_scale + row,
            chunk_states + (h0_row + i_c * (H * K)) * V + i_v * BV, v_new + row * V + i_v * BV,
            g, bos + i_c * C, C, i_h, H, off_sk, off_ks, off_sv, off_kv, o_s,
            NH, BT, BC, USE_G, ROW_SCALED, S16, False, ROWS_FULL,
        )  # fmt: skip
    if n_full * C < n_tok_all:  # the partial chunk at the sequence's end
        row = row0 + n_full * (C * NH * H)
        b_h = _chunk_step(
            b_h, k + row * K, w + row * K, u + row * V + i_v * BV, w_scale + row, u_scale + row,
            chunk_states + (h0_row + n_full * (H * K)) * V + i_v * BV, v_new + row * V + i_v * BV,
            g, bos + n_full * C, n_tok_all - n_full * C, i_h, H, off_sk, off_ks, off_sv, off_kv, o_s,
            NH, BT, BC, USE_G, ROW_SCALED, S16, True, ROWS_FULL,
        )  # fmt: skip
    tl.store(final_state + state0 + off_kv, b_h)
