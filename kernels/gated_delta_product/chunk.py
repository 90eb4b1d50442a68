"""Chunked Gated DeltaProduct as ``torch.library`` custom ops: forward, dedicated backward, fake kernels.

Custom ops keep the Triton launches opaque to torch.compile (which traces the fake implementations) and carry
the autograd rule, so the op composes with FSDP2 and activation checkpointing like any aten op.

Forward: UT transform (``wy_fwd``) -> forward state pass (``state_fwd``: chunk states, δ, final state) ->
outputs (``output_fwd``). It saves T, W (and W's row scales), the chunk states and δ, so the backward needs
no sequential forward pass. Backward: local ∂L/∂δ (``dv_local``) -> reverse state pass (``state_bwd``) ->
per-chunk gradients (``dqkw``, then ``wy_bwd``). Every launch comes from ``launch_table.launch_table``.
The first forward (and the first backward) of each kind compiles its kernels at once (``_precompile``).
"""

from __future__ import annotations

import torch

from titan_delta_kernels._precompile import precompile
from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout
from titan_delta_kernels.gated_delta_product.grads import dqkw, wy_bwd
from titan_delta_kernels.gated_delta_product.launch_table import launch_table, state_block_v
from titan_delta_kernels.gated_delta_product.output import dv_local, output_fwd
from titan_delta_kernels.gated_delta_product.state import state_bwd, state_fwd
from titan_delta_kernels.gated_delta_product.wy_fwd import wy_fwd

Tensor = torch.Tensor


def _plan(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, cu_seqlens: Tensor | None, num_householder: int):
    """(chunk geometry, sequence layout, launch table) of one call."""
    geo = chunk_geometry(num_householder)
    seqs = sequence_layout(q.shape[0], q.shape[1], cu_seqlens, geo, q.device)
    cfg = launch_table(k.shape[-1], v.shape[-1], num_householder, k.dtype, g is not None,
                       _sequence_heads(q, cu_seqlens))  # fmt: skip
    return geo, seqs, cfg


def _sequence_heads(q: Tensor, cu_seqlens: Tensor | None) -> int:
    """Sequences × heads of a call, from shapes alone."""
    sequences = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return sequences * q.shape[2]


def _kernel_set(stage: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, cu_seqlens: Tensor | None,
                num_householder: int, *optional: Tensor | None) -> tuple:  # fmt: skip
    """What selects the kernels (and their constexprs) of one pass, for ``precompile``."""
    state_bv = state_block_v(k.shape[-1], v.shape[-1], num_householder, _sequence_heads(q, cu_seqlens))
    return ("gdp", stage, k.shape[-1], v.shape[-1], num_householder, k.dtype, g is not None,
            cu_seqlens is not None, state_bv, *(x is not None for x in optional))  # fmt: skip


@torch.library.custom_op("titan_delta::gdp_chunk_fwd", mutates_args=())
def gdp_chunk_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, initial_state: Tensor | None,
    cu_seqlens: Tensor | None, num_householder: int, scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Returns (o, final_state fp32, T, W, W's row scales, chunk states, δ); all but the first two serve the
    backward. W's row scales are empty for fp32 inputs (W fp32)."""
    args = (q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale)
    key = _kernel_set("fwd", q, k, v, g, cu_seqlens, num_householder, initial_state)
    precompile(key, lambda: _forward(*args), q.device)
    return _forward(*args)


def _forward(q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale):
    geo, seqs, cfg = _plan(q, k, v, g, cu_seqlens, num_householder)
    t_inv, w, u, w_scale, u_scale = wy_fwd(k, v, beta, g, geo, seqs, cfg)
    chunk_states, v_new, final_state = state_fwd(k, w, u, w_scale, u_scale, g, initial_state, geo, seqs, cfg)
    o = output_fwd(q, k, g, v_new, chunk_states, scale, geo, seqs, cfg)
    if w_scale is None:
        w_scale = k.new_empty(0, dtype=torch.float32)
    return o, final_state, t_inv, w, w_scale, chunk_states, v_new


@gdp_chunk_fwd.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale):
    (B, T, H, _), K, V = q.shape, k.shape[-1], v.shape[-1]
    geo, seqs, _ = _plan(q, k, v, g, cu_seqlens, num_householder)
    sixteen = k.dtype != torch.float32
    w = torch.empty_like(k, dtype=torch.float16 if sixteen else torch.float32)
    w_scale = k.new_empty(k.shape[:3] if sixteen else (0,), dtype=torch.float32)
    final_state = q.new_empty(seqs.num_sequences, H, K, V, dtype=torch.float32)
    return (q.new_empty(B, T, H, V), final_state, k.new_empty(*k.shape[:3], geo.block_steps), w, w_scale,
            k.new_empty(seqs.grid_chunks, H, K, V), torch.empty_like(v, dtype=k.dtype))  # fmt: skip


@torch.library.custom_op("titan_delta::gdp_chunk_bwd", mutates_args=())
def gdp_chunk_bwd(
    d_out: Tensor, d_final: Tensor | None, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor,
    cu_seqlens: Tensor | None, t_inv: Tensor, w: Tensor, w_scale: Tensor | None, chunk_states: Tensor,
    v_new: Tensor, num_householder: int, scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Returns (dq, dk, dv, dg — empty when g is None —, dβ, ∂L/∂initial_state fp32)."""
    args = (d_out, d_final, q, k, v, g, beta, cu_seqlens, t_inv, w, w_scale, chunk_states, v_new,
            num_householder, scale)  # fmt: skip
    key = _kernel_set("bwd", q, k, v, g, cu_seqlens, num_householder, d_final)
    precompile(key, lambda: _backward_body(*args), q.device)
    return _backward_body(*args)


def _backward_body(d_out, d_final, q, k, v, g, beta, cu_seqlens, t_inv, w, w_scale, chunk_states, v_new,
                   num_householder, scale):  # fmt: skip
    geo, seqs, cfg = _plan(q, k, v, g, cu_seqlens, num_householder)
    d_out = d_out.contiguous()
    d_vlocal = dv_local(q, k, g, d_out, scale, geo, seqs, cfg)
    d_final = None if d_final is None else d_final.contiguous()
    d_chunk_states, d_delta, d_h0 = state_bwd(q, k, w, w_scale, g, d_out, d_final, d_vlocal, scale, geo, seqs,
                                              cfg)  # fmt: skip
    dq, dk_part, dw, dG_step, dG_tok = dqkw(q, k, g, v_new, chunk_states, d_chunk_states, d_delta, d_out,
                                            scale, geo, seqs, cfg)  # fmt: skip
    dk, dv, dg, dbeta = wy_bwd(k, v, g, beta, t_inv, d_delta, dk_part, dw, dG_step, dG_tok, geo, seqs, cfg)
    return dq, dk, dv, q.new_empty(0) if dg is None else dg, dbeta, d_h0


@gdp_chunk_bwd.register_fake
def _(d_out, d_final, q, k, v, g, beta, cu_seqlens, t_inv, w, w_scale, chunk_states, v_new, num_householder,
      scale):  # fmt: skip
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    H, K, V = q.shape[2], k.shape[-1], v.shape[-1]
    dg = q.new_empty(0) if g is None else torch.empty_like(g)
    d_h0 = q.new_empty(N, H, K, V, dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dg, torch.empty_like(beta), d_h0


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale = inputs
    _, _, t_inv, w, w_scale, chunk_states, v_new = output
    w_scale = None if k.dtype == torch.float32 else w_scale  # fp32 W: no row scales
    ctx.save_for_backward(q, k, v, g, beta, cu_seqlens, t_inv, w, w_scale, chunk_states, v_new)
    # T, W, ... are internal outputs: never materialise zero gradients for them (nor for an unused state).
    ctx.set_materialize_grads(False)
    ctx.num_householder = num_householder
    ctx.scale = scale
    ctx.state_dtype = None if initial_state is None else initial_state.dtype


def _backward(ctx, d_out, d_final, *_internal_grads):
    q, k, v, g, beta, cu_seqlens, t_inv, w, w_scale, chunk_states, v_new = ctx.saved_tensors
    if d_out is None:
        d_out = torch.zeros_like(q[..., :1]).expand(*q.shape[:3], v.shape[-1])
    dq, dk, dv, dg, dbeta, d_h0 = gdp_chunk_bwd(
        d_out, d_final, q, k, v, g, beta, cu_seqlens, t_inv, w, w_scale, chunk_states, v_new,
        ctx.num_householder, ctx.scale,
    )  # fmt: skip
    d_init = None if ctx.state_dtype is None else d_h0.to(ctx.state_dtype)
    return dq, dk, dv, (None if g is None else dg), dbeta, d_init, None, None, None


torch.library.register_autograd("titan_delta::gdp_chunk_fwd", _backward, setup_context=_setup_context)
