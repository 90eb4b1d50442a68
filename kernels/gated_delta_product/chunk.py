"""Chunked Gated DeltaProduct as ``torch.library`` custom ops: forward, dedicated backward, fake kernels.

Custom ops keep the Triton launches opaque to torch.compile (``fullgraph=True`` traces through them via the
fake implementations) and carry the autograd rule, so the op composes with FSDP2 and activation
checkpointing like any aten op. The forward saves T = (I + A)⁻¹, W and U; the backward recomputes the
chunk states (cheaper in memory than keeping [chunks, K, V] per head).
"""

from __future__ import annotations

import torch

from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout
from titan_delta_kernels.gated_delta_product.grads import chunk_grads
from titan_delta_kernels.gated_delta_product.output import dv_local, output_fwd
from titan_delta_kernels.gated_delta_product.state import state_bwd, state_fwd
from titan_delta_kernels.gated_delta_product.wy_fwd import wy_fwd

Tensor = torch.Tensor


def _num_sequences(q: Tensor, cu_seqlens: Tensor | None) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


@torch.library.custom_op("titan_delta::gdp_chunk_fwd", mutates_args=())
def gdp_chunk_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor,
    initial_state: Tensor | None,
    cu_seqlens: Tensor | None,
    num_householder: int,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns (o, final_state fp32, T, W, U); the last three are saved for the backward only."""
    geo = chunk_geometry(num_householder)
    seqs = sequence_layout(q.shape[0], q.shape[1], cu_seqlens, geo, q.device)
    t_inv, w, u = wy_fwd(k, v, beta, g, geo, seqs)
    chunk_states, v_new, final_state = state_fwd(k, w, u, g, initial_state, geo, seqs)
    o = output_fwd(q, k, g, v_new, chunk_states, scale, geo, seqs)
    return o, final_state, t_inv, w, u


@gdp_chunk_fwd.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale):
    B, T, H, _ = q.shape
    K, V = k.shape[-1], v.shape[-1]
    geo = chunk_geometry(num_householder)
    o = q.new_empty(B, T, H, V)
    final_state = q.new_empty(_num_sequences(q, cu_seqlens), H, K, V, dtype=torch.float32)
    t_inv = k.new_empty(*k.shape[:3], geo.block_steps)
    w = torch.empty_like(k, dtype=torch.float32)
    u = torch.empty_like(v, dtype=torch.float32)
    return o, final_state, t_inv, w, u


@torch.library.custom_op("titan_delta::gdp_chunk_bwd", mutates_args=())
def gdp_chunk_bwd(
    d_out: Tensor,
    d_final: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor,
    initial_state: Tensor | None,
    cu_seqlens: Tensor | None,
    t_inv: Tensor,
    w: Tensor,
    u: Tensor,
    num_householder: int,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv, dg — empty when g is None —, dβ, ∂L/∂initial_state fp32)."""
    geo = chunk_geometry(num_householder)
    seqs = sequence_layout(q.shape[0], q.shape[1], cu_seqlens, geo, q.device)
    d_out = d_out.contiguous()
    chunk_states, v_new, _ = state_fwd(k, w, u, g, initial_state, geo, seqs)
    d_vlocal = dv_local(q, k, g, d_out, scale, geo, seqs)
    d_chunk_states, d_delta, d_h0 = state_bwd(
        q, k, w, g, d_out, None if d_final is None else d_final.contiguous(), d_vlocal, scale, geo, seqs
    )
    dq, dk, dv, dg, dbeta = chunk_grads(
        q, k, v, g, beta, t_inv, v_new, chunk_states, d_chunk_states, d_delta, d_out, scale, geo, seqs
    )
    return dq, dk, dv, q.new_empty(0) if dg is None else dg, dbeta, d_h0


@gdp_chunk_bwd.register_fake
def _(d_out, d_final, q, k, v, g, beta, initial_state, cu_seqlens, t_inv, w, u, num_householder, scale):
    N, H, K, V = _num_sequences(q, cu_seqlens), q.shape[2], k.shape[-1], v.shape[-1]
    dg = q.new_empty(0) if g is None else torch.empty_like(g)
    d_h0 = q.new_empty(N, H, K, V, dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dg, torch.empty_like(beta), d_h0


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale = inputs
    _, _, t_inv, w, u = output
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, t_inv, w, u)
    # T, W, U are internal outputs: never materialise zero gradients for them (nor for an unused state).
    ctx.set_materialize_grads(False)
    ctx.num_householder = num_householder
    ctx.scale = scale
    ctx.state_dtype = None if initial_state is None else initial_state.dtype


def _backward(ctx, d_out, d_final, _dt, _dw, _du):
    q, k, v, g, beta, initial_state, cu_seqlens, t_inv, w, u = ctx.saved_tensors
    if d_out is None:
        d_out = torch.zeros_like(q[..., :1]).expand(*q.shape[:3], v.shape[-1])
    dq, dk, dv, dg, dbeta, d_h0 = gdp_chunk_bwd(
        d_out, d_final, q, k, v, g, beta, initial_state, cu_seqlens, t_inv, w, u,
        ctx.num_householder, ctx.scale,
    )  # fmt: skip
    d_init = None if initial_state is None else d_h0.to(ctx.state_dtype)
    return dq, dk, dv, (None if g is None else dg), dbeta, d_init, None, None, None


torch.library.register_autograd("titan_delta::gdp_chunk_fwd", _backward, setup_context=_setup_context)
