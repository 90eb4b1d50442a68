"""Token-by-token Gated DeltaProduct for decoding with a carried state (forward only): one program per
(sequence, head, V tile) keeps its [K, BV] slice of the state in fp32 registers and applies each token's gate
and n_h rank-1 steps in order. For a few new tokens this beats the chunked path's 64-step UT transform and
three launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.gated_delta_product._common import sequence_bounds
from titan_delta_kernels.gated_delta_product.launch_table import NUM_WARPS

Tensor = torch.Tensor


@triton.jit
def recurrent_fwd_kernel(
    q, k, v, g, beta, h0, o, final_state,
    cu_seqlens, T, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    i_seq, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, _ = sequence_bounds(i_seq, cu_seqlens, cu_seqlens, T, 0, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    state_off = ((i_seq * H + i_h) * K + o_k[:, None]).to(tl.int64) * V + o_v[None, :]
    if USE_H0:
        b_h = tl.load(h0 + state_off, mask=m_k[:, None] & m_v[None, :], other=0.0).to(tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    for t in range(bos, eos):
        t64 = tl.cast(t, tl.int64)
        tok = t64 * H + i_h
        if USE_G:
            b_h *= tl.exp(tl.load(g + tok).to(tl.float32))
        for j in tl.static_range(NH):
            step = (t64 * NH + j) * H + i_h
            b_k = tl.load(k + step * K + o_k, mask=m_k, other=0.0).to(tl.float32)
            b_v = tl.load(v + step * V + o_v, mask=m_v, other=0.0).to(tl.float32)
            b_beta = tl.load(beta + step).to(tl.float32)
            b_err = b_beta * (b_v - tl.sum(b_k[:, None] * b_h, 0))
            b_h += b_k[:, None] * b_err[None, :]
        b_q = tl.load(q + tok * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_o = tl.sum(b_q[:, None] * b_h, 0) * scale
        tl.store(o + tok * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    tl.store(final_state + state_off, b_h, mask=m_k[:, None] & m_v[None, :])


@torch.library.custom_op("titan_delta::gdp_recurrent_fwd", mutates_args=())
def gdp_recurrent_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, initial_state: Tensor | None,
    cu_seqlens: Tensor | None, num_householder: int, scale: float,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Returns (o like q with V columns, final state fp32 [N,H,K,V])."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    o = q.new_empty(B, T, H, V)
    final_state = torch.empty(N, H, K, V, dtype=torch.float32, device=q.device)
    BK, BV = max(16, next_power_of_2(K)), min(32, max(16, next_power_of_2(V)))
    cu = q.new_zeros(1, dtype=torch.int32) if cu_seqlens is None else cu_seqlens.to(torch.int32)
    launch(
        recurrent_fwd_kernel, (N, H, cdiv(V, BV)),
        q, k, v, k if g is None else g, beta, k if initial_state is None else initial_state, o, final_state,
        cu, T, scale,
        H=H, K=K, V=V, NH=num_householder, BK=BK, BV=BV, USE_G=g is not None,
        USE_H0=initial_state is not None, IS_VARLEN=cu_seqlens is not None, num_warps=NUM_WARPS,
    )  # fmt: skip
    return o, final_state


@gdp_recurrent_fwd.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale):
    B, T, H, K = q.shape
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return q.new_empty(B, T, H, v.shape[-1]), q.new_empty(N, H, K, v.shape[-1], dtype=torch.float32)
