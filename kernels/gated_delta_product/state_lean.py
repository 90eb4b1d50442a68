"""The two state passes with a short chunk loop, where K is a power of two and the V tile divides V
(``state.py`` has the general kernels and the launchers).

* Tile offsets are int32 tensors built once before the loop; only a few scalar int64 bases move per chunk.
* Full chunks mask rows only where the block has padding rows (C·n_h < BT, C < BC: the same every chunk);
  the one partial chunk at a sequence's end takes the masked copy of the step (``PARTIAL``).
* Forward: with ``S16`` (16-bit inputs, K = 128) W·S is one fp16 product of W as stored and the state scaled
  per column (``scaled_f16``): tf32's 11 bits, half the MMA steps. Else bitwise ``state.state_fwd_kernel``.
* Reverse (row-scaled fp16 W only): Wᵀ·dδ is one fp16 product instead of three 16-bit ones: W's row scales
  move onto dδ's rows (they act along the sum over steps), and dδ is scaled per column (``scaled_f16``).
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
    S16: tl.constexpr, PARTIAL: tl.constexpr, ROWS_FULL: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One chunk: store its entry state, δ = U − W S, and return the state leaving it. Each product is issued
    as soon as its operands exist; the work that does not need its result follows it."""
    m_s = o_s < n_tok * NH  # all true for full chunks when C·n_h == BT (then never used)
    b_w = _load(w_c + off_sk, m_s[:, None], PARTIAL, ROWS_FULL)
    if S16:  # fp16 W as stored · the state scaled per column to fp16: tf32's 11 bits, no widening of W
        h16, h_unscale = scaled_f16(b_h, 0)
        b_wh = tl.dot(b_w, h16)
    elif ROW_SCALED:
        b_wh = tl.dot(b_w.to(tl.float32), b_h, input_precision=PREC)
    else:
        b_wh = tl.dot(b_w, b_h.to(b_w.dtype), input_precision=PREC)
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
    b_h = tl.dot(b_kt, (b_delta * decay[:, None]).to(wt), b_h, input_precision=PREC)
    _store(d_c + off_sv, b_delta.to(d_c.dtype.element_ty), m_s[:, None], PARTIAL, ROWS_FULL)
    return b_h


@triton.jit
def state_fwd_lean_kernel(
    k, w, u, w_scale, u_scale, g, h0, chunk_states, v_new, final_state,
    cu_seqlens, chunk_offsets, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr, ROW_SCALED: tl.constexpr,
    S16: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``state.state_fwd_kernel`` for W fp32 or row-scaled fp16, K a power of two, BV dividing V."""
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
            NH, BT, BC, USE_G, ROW_SCALED, S16, False, ROWS_FULL, PREC,
        )  # fmt: skip
    if n_full * C < n_tok_all:  # the partial chunk at the sequence's end
        row = row0 + n_full * (C * NH * H)
        b_h = _chunk_step(
            b_h, k + row * K, w + row * K, u + row * V + i_v * BV, w_scale + row, u_scale + row,
            chunk_states + (h0_row + n_full * (H * K)) * V + i_v * BV, v_new + row * V + i_v * BV,
            g, bos + n_full * C, n_tok_all - n_full * C, i_h, H, off_sk, off_ks, off_sv, off_kv, o_s,
            NH, BT, BC, USE_G, ROW_SCALED, S16, True, ROWS_FULL, PREC,
        )  # fmt: skip
    tl.store(final_state + state0 + off_kv, b_h)


@triton.jit
def _bwd_chunk_step(
    b_dh, q_c, k_c, w_c, ws_c, do_c, dvl_c, dd_c, dh_c, g, tok0, n_tok, i_h, H, scale,
    off_sk, off_ks, off_sv, off_kt, off_tv, off_kv, o_s, o_t,
    NH: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, USE_G: tl.constexpr, PARTIAL: tl.constexpr,
    ROWS_FULL: tl.constexpr, TOKS_FULL: tl.constexpr,
):  # fmt: skip
    """One chunk backwards: store ∂L/∂(state leaving it) and the total ∂L/∂δ; return ∂L/∂(entry state).

    The work that does not need the carried gradient comes first (the gates, q·dOᵀ, the local ∂L/∂δ and
    W's row scales), so that it is under way before the two products that do: measured faster than
    issuing q·dOᵀ last (docs/kernels_gated_delta_product.md, "Launch table")."""
    m_s = o_s < n_tok * NH
    m_t = o_t < n_tok
    G, Gq, G_last = chunk_log_gates(g, tok0, n_tok, i_h, H, NH, BT, BC, USE_G)
    b_qt = _load(q_c + off_kt, m_t[None, :], PARTIAL, TOKS_FULL)
    b_do = _load(do_c + off_tv, m_t[:, None], PARTIAL, TOKS_FULL)
    b_do = (b_do.to(tl.float32) * (scale * tl.exp(Gq))[:, None]).to(b_qt.dtype)
    b_qdo = tl.dot(b_qt, b_do)
    b_dd = _load(dvl_c + off_sv, m_s[:, None], PARTIAL, ROWS_FULL).to(tl.float32)
    w_scale = _load(ws_c + o_s * H, m_s, PARTIAL, ROWS_FULL)
    b_k = _load(k_c + off_sk, m_s[:, None], PARTIAL, ROWS_FULL)
    b_kdh = tl.dot(b_k, b_dh.to(b_k.dtype))
    tl.store(dh_c + off_kv, b_dh.to(dh_c.dtype.element_ty))
    b_wt = _load(w_c + off_ks, m_s[None, :], PARTIAL, ROWS_FULL)  # fp16 Wᵀ as stored
    b_dd += b_kdh * tl.exp(G_last - G)[:, None]
    dd16, d_unscale = scaled_f16(b_dd * w_scale[:, None], 0)  # W's row scales onto dδ's rows
    b_wdd = tl.dot(b_wt, dd16) * d_unscale[None, :]
    b_dh = b_dh * tl.exp(G_last) + b_qdo - b_wdd
    _store(dd_c + off_sv, b_dd.to(dd_c.dtype.element_ty), m_s[:, None], PARTIAL, ROWS_FULL)
    return b_dh


@triton.jit
def state_bwd_lean_kernel(
    q, k, w, w_scale, g, d_out, d_final, d_vlocal, d_chunk_states, d_delta, d_h0,
    cu_seqlens, chunk_offsets, T, NT, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, C: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_DHT: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """``state.state_bwd_kernel`` for row-scaled fp16 W (16-bit inputs), K a power of two, BV dividing V."""
    i_seq, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk = sequence_bounds(i_seq, cu_seqlens, chunk_offsets, T, NT, IS_VARLEN)
    o_s = tl.arange(0, BT)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, BV)
    off_sk = o_s[:, None] * (H * K) + o_k[None, :]
    off_ks = o_s[None, :] * (H * K) + o_k[:, None]
    off_sv = o_s[:, None] * (H * V) + o_v[None, :]
    off_kt = o_t[None, :] * (H * K) + o_k[:, None]
    off_tv = o_t[:, None] * (H * V) + o_v[None, :]
    off_kv = o_k[:, None] * V + o_v[None, :]
    state0 = ((i_seq * H + i_h) * K).to(tl.int64) * V + i_v * BV
    if USE_DHT:
        b_dh = tl.load(d_final + state0 + off_kv).to(tl.float32)
    else:
        b_dh = tl.zeros([K, BV], dtype=tl.float32)
    n_tok_all = eos - bos
    n_full = n_tok_all // C
    row0 = bos.to(tl.int64) * NH * H + i_h  # the head's first step row
    qrow0 = bos.to(tl.int64) * H + i_h  # its first token row
    h0_row = (first_chunk.to(tl.int64) * H + i_h) * K
    ROWS_FULL: tl.constexpr = C * NH == BT
    TOKS_FULL: tl.constexpr = C == BC
    if n_full * C < n_tok_all:  # the partial chunk at the sequence's end comes first
        row = row0 + n_full * (C * NH * H)
        qrow = qrow0 + n_full * (C * H)
        b_dh = _bwd_chunk_step(
            b_dh, q + qrow * K, k + row * K, w + row * K, w_scale + row, d_out + qrow * V + i_v * BV,
            d_vlocal + row * V + i_v * BV, d_delta + row * V + i_v * BV,
            d_chunk_states + (h0_row + n_full * (H * K)) * V + i_v * BV,
            g, bos + n_full * C, n_tok_all - n_full * C, i_h, H, scale,
            off_sk, off_ks, off_sv, off_kt, off_tv, off_kv, o_s, o_t,
            NH, BT, BC, USE_G, True, ROWS_FULL, TOKS_FULL,
        )  # fmt: skip
    for i_rev in range(0, n_full):
        i_c = n_full - 1 - i_rev
        row = row0 + i_c * (C * NH * H)
        qrow = qrow0 + i_c * (C * H)
        b_dh = _bwd_chunk_step(
            b_dh, q + qrow * K, k + row * K, w + row * K, w_scale + row, d_out + qrow * V + i_v * BV,
            d_vlocal + row * V + i_v * BV, d_delta + row * V + i_v * BV,
            d_chunk_states + (h0_row + i_c * (H * K)) * V + i_v * BV,
            g, bos + i_c * C, C, i_h, H, scale,
            off_sk, off_ks, off_sv, off_kt, off_tv, off_kv, o_s, o_t,
            NH, BT, BC, USE_G, False, ROWS_FULL, TOKS_FULL,
        )  # fmt: skip
    tl.store(d_h0 + state0 + off_kv, b_dh)
