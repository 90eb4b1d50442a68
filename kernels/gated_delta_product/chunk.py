"""Chunked Gated DeltaProduct as ``torch.library`` custom ops: forward, dedicated backward, fake kernels.

Custom ops keep the Triton launches opaque to torch.compile (``fullgraph=True`` traces through them via the
fake implementations) and carry the autograd rule, so the op composes with FSDP2 and activation
checkpointing like any aten op. Without ``save_states`` the forward saves T = (I + A)⁻¹, W and U and the
backward recomputes the chunk states (cheaper in memory than keeping [chunks, K, V] per head).

Variants (``save_states`` is on by default, ``lowp`` opt-in, ``plain`` turns both off; see ``options.py``):
* ``save_states``: the forward saves the chunk states and δ it computed anyway (instead of U), so the
  backward skips its sequential state pass — one launch and ~1.2 GB of traffic fewer at [4, 4096, 16, 128],
  n_h = 2 — for [chunks, H, K, V] more activation memory (V/64 times the size of k: 2× at V = 128).
  Results are bitwise those of the ``plain`` path.
* ``options`` (a variant string, see ``options.py``): ``fastwy`` (block-wise UT transform, ``wy_fast.py``)
  and launch overrides of the state passes, the UT transform and the gradient kernels.
* ``lowp``: W, U, δ and the backward's per-step intermediates are stored in the input dtype (bf16 in
  training, as FLA does) and the state passes and S·δ products multiply in it: half the bytes of those
  tensors, less shared memory and fewer registers; results move at rounding level (identical for fp32).
* ``lowp_safe`` (an ``options`` flag, in the default since the eleventh session): ``lowp`` without W and U:
  δ and the backward's per-step intermediates in the input dtype, W and U as without it (fp32, or row-scaled
  fp16 with ``w16``) and so the state passes' products as by default. With ``lowp`` on as well, ``lowp``
  wins.
* ``lowp_state`` / ``bf16x3`` (``options`` flags): storage as by default (or as lowp_safe's), only
  state_bwd's Wᵀ·dδ changes operands: rounded to the input dtype (lowp_state), or split into three bf16
  products (bf16x3, tighter than the default's tf32). Either keeps lowp's fast state_bwd, whose speed came
  from this product's operand layout (``state.WT_MODES``). No effect with ``lowp`` (W already 16-bit).
* ``kslice`` (an ``options`` flag): the backward's per-chunk gradient kernels from ``grads_sliced.py`` (K
  streamed in slices, fewer registers) instead of ``grads.py``; same results up to fp32 rounding.
* ``dkp16`` (an ``options`` flag, in the default): the direct dk that dqkw hands to wy_bwd is stored in k's
  dtype rather than δ's.
* ``w16`` (an ``options`` flag, in the default since the eleventh session, for 16-bit inputs without ``lowp``
  or ``wplanes``): W and U in fp16 with one power-of-two scale per row; the forward returns the scales as
  two more outputs (empty otherwise) and the backward takes W's (and U's, when it recomputes the states).
* ``sflean`` / ``sfs16`` / ``sbw16`` / ``otrans`` (``options`` flags, in the default since the twelfth
  session): the short-loop state passes (``state_lean.py``, ``state_bwd_lean.py``) with their fp16 products,
  and the transposed output kernel (``output.py``); see ``options.py``.
"""

from __future__ import annotations

import torch

from titan_delta_kernels.gated_delta_product import grads, grads_sliced
from titan_delta_kernels.gated_delta_product._common import chunk_geometry, row_scaled_f16, sequence_layout
from titan_delta_kernels.gated_delta_product.options import GdpOptions, parse_options
from titan_delta_kernels.gated_delta_product.output import dv_local, output_fwd
from titan_delta_kernels.gated_delta_product.state import (
    is_planes,
    plane_dtype,
    split_planes,
    state_bwd,
    state_fwd,
)
from titan_delta_kernels.gated_delta_product.wy_fast import wy_fwd_fast
from titan_delta_kernels.gated_delta_product.wy_fwd import wy_fwd
from titan_delta_kernels.gated_delta_product.wy_series import wy_fwd_series

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
    save_states: bool = False,
    lowp: bool = False,
    options: str = "plain",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns (o, final_state fp32, T, W, U, chunk states, δ, W's row scales, U's row scales); all but the
    first two serve the backward. The scales are empty unless W and U are row-scaled fp16 (``w16``).

    ``save_states`` only changes what the autograd context keeps (the outputs are the same).
    """
    opts = parse_options(options)
    geo = chunk_geometry(num_householder)
    seqs = sequence_layout(q.shape[0], q.shape[1], cu_seqlens, geo, q.device)
    planes = _planes(k, lowp, opts)
    row_scaled = _row_scaled(k, lowp, opts)
    w_scale = u_scale = None
    if opts.wyseries:
        t_inv, w, u, *scales = wy_fwd_series(k, v, beta, g, geo, seqs, _inter_dtype(k, lowp), opts.wy_warps,
                                             planes, row_scaled)  # fmt: skip
        if row_scaled:
            w_scale, u_scale = scales
    else:
        transform = wy_fwd_fast if opts.fastwy else wy_fwd
        t_inv, w, u = transform(k, v, beta, g, geo, seqs, _inter_dtype(k, lowp), opts.wy_warps)
        w = split_planes(w) if planes else w
        if row_scaled:
            (w, w_scale), (u, u_scale) = row_scaled_f16(w), row_scaled_f16(u)
    chunk_states, v_new, final_state = state_fwd(
        k, w, u, g, initial_state, geo, seqs, delta_dtype=_inter_dtype(k, lowp or opts.lowp_safe),
        fwd16=opts.fwd16(), w_scale=w_scale, u_scale=u_scale, **_state_launch(opts, forward=True),
    )  # fmt: skip
    o = output_fwd(q, k, g, v_new, chunk_states, scale, geo, seqs, opts.output_block_k, opts.output_block_v,
                   transposed=opts.otrans)  # fmt: skip
    if w_scale is None or u_scale is None:  # two distinct empties: custom-op outputs must not alias
        w_scale, u_scale = k.new_empty(0, dtype=torch.float32), k.new_empty(0, dtype=torch.float32)
    return o, final_state, t_inv, w, u, chunk_states, v_new, w_scale, u_scale


@gdp_chunk_fwd.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale, save_states=False, lowp=False,
      options="plain"):  # fmt: skip
    B, T, H, _ = q.shape
    K, V = k.shape[-1], v.shape[-1]
    geo = chunk_geometry(num_householder)
    chunks = sequence_layout(B, T, cu_seqlens, geo, q.device).grid_chunks
    o = q.new_empty(B, T, H, V)
    final_state = q.new_empty(_num_sequences(q, cu_seqlens), H, K, V, dtype=torch.float32)
    t_inv = k.new_empty(*k.shape[:3], geo.block_steps)
    opts = parse_options(options)
    row_scaled = _row_scaled(k, lowp, opts)
    store_dtype = torch.float16 if row_scaled else _inter_dtype(k, lowp)
    if _planes(k, lowp, opts):
        w = k.new_empty(*k.shape[:3], 2 * K, dtype=plane_dtype())
    else:
        w = torch.empty_like(k, dtype=store_dtype)
    u = torch.empty_like(v, dtype=store_dtype)
    v_new = torch.empty_like(v, dtype=_inter_dtype(k, lowp or opts.lowp_safe))
    scale_shape = k.shape[:3] if row_scaled else (0,)
    w_scale = k.new_empty(scale_shape, dtype=torch.float32)
    u_scale = k.new_empty(scale_shape, dtype=torch.float32)
    return o, final_state, t_inv, w, u, k.new_empty(chunks, H, K, V), v_new, w_scale, u_scale


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
    u: Tensor | None,
    chunk_states: Tensor | None,
    v_new: Tensor | None,
    w_scale: Tensor | None,
    u_scale: Tensor | None,
    num_householder: int,
    scale: float,
    options: str = "plain",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv, dg — empty when g is None —, dβ, ∂L/∂initial_state fp32).

    Given the forward's chunk states and δ (``save_states``) it uses them; otherwise it recomputes both
    from U. Intermediates follow W's dtype (fp32, or the input dtype with ``lowp``), or are in the input
    dtype with ``lowp_safe``; row-scaled fp16 W (``w_scale`` given, ``w16``) counts as fp32.
    """
    opts = parse_options(options)
    geo = chunk_geometry(num_householder)
    seqs = sequence_layout(q.shape[0], q.shape[1], cu_seqlens, geo, q.device)
    d_out = d_out.contiguous()
    widened = is_planes(w, k) or w_scale is not None
    inter = k.dtype if opts.lowp_safe else torch.float32 if widened else w.dtype
    if chunk_states is None or v_new is None:
        if u is None:
            raise ValueError("gdp_chunk_bwd needs U, or the chunk states and δ saved by the forward")
        chunk_states, v_new, _ = state_fwd(
            k, w, u, g, initial_state, geo, seqs, delta_dtype=inter, fwd16=opts.fwd16(), w_scale=w_scale,
            u_scale=u_scale, **_state_launch(opts, forward=True),
        )  # fmt: skip
    d_vlocal = dv_local(q, k, g, d_out, scale, geo, seqs, inter_dtype=inter, block_v=opts.dv_local_block_v)
    d_chunk_states, d_delta, d_h0 = state_bwd(
        q, k, w, g, d_out, None if d_final is None else d_final.contiguous(), d_vlocal, scale, geo, seqs,
        **_state_launch(opts, forward=False), wt_mode=opts.wt_mode(), w_scale=w_scale,
    )
    grad_args = (q, k, v, g, beta, t_inv, v_new, chunk_states, d_chunk_states, d_delta, d_out, scale, geo,
                 seqs, opts.grad_warps)
    dk_part_dtype = k.dtype if opts.dkp16 else None
    if opts.kslice:
        dq, dk, dv, dg, dbeta = grads_sliced.chunk_grads(*grad_args, max_registers=opts.grad_max_registers,
                                                         dqkw_max_registers=opts.dqkw_max_registers,
                                                         dqkw_block_k=opts.dqkw_block_k,
                                                         dk_part_dtype=dk_part_dtype,
                                                         wy_bwd_stages=opts.wy_bwd_stages,
                                                         wy_bwd_block_k=opts.wy_bwd_block_k,
                                                         wy_bwd_hoisted=opts.wyhoist)
    else:
        dq, dk, dv, dg, dbeta = grads.chunk_grads(*grad_args, dk_part_dtype=dk_part_dtype)
    return dq, dk, dv, q.new_empty(0) if dg is None else dg, dbeta, d_h0


@gdp_chunk_bwd.register_fake
def _(d_out, d_final, q, k, v, g, beta, initial_state, cu_seqlens, t_inv, w, u, chunk_states, v_new,
      w_scale, u_scale, num_householder, scale, options="plain"):  # fmt: skip
    N, H, K, V = _num_sequences(q, cu_seqlens), q.shape[2], k.shape[-1], v.shape[-1]
    dg = q.new_empty(0) if g is None else torch.empty_like(g)
    d_h0 = q.new_empty(N, H, K, V, dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dg, torch.empty_like(beta), d_h0


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale, save_states, lowp, options = inputs
    _, _, t_inv, w, u, chunk_states, v_new, w_scale, u_scale = output
    if not _row_scaled(k, lowp, parse_options(options)):
        w_scale = u_scale = None
    # Either U (states recomputed in the backward) or the states and δ themselves, never both.
    kept = (None, chunk_states, v_new, None) if save_states else (u, None, None, u_scale)
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, t_inv, w, w_scale, *kept)
    # T, W, U, ... are internal outputs: never materialise zero gradients for them (nor for an unused state).
    ctx.set_materialize_grads(False)
    ctx.num_householder = num_householder
    ctx.scale = scale
    ctx.options = options
    ctx.state_dtype = None if initial_state is None else initial_state.dtype


def _backward(ctx, d_out, d_final, *_internal_grads):
    q, k, v, g, beta, initial_state, cu_seqlens, t_inv, w, w_scale, u, chunk_states, v_new, u_scale = (
        ctx.saved_tensors
    )
    if d_out is None:
        d_out = torch.zeros_like(q[..., :1]).expand(*q.shape[:3], v.shape[-1])
    dq, dk, dv, dg, dbeta, d_h0 = gdp_chunk_bwd(
        d_out, d_final, q, k, v, g, beta, initial_state, cu_seqlens, t_inv, w, u, chunk_states, v_new,
        w_scale, u_scale, ctx.num_householder, ctx.scale, ctx.options,
    )  # fmt: skip
    d_init = None if initial_state is None else d_h0.to(ctx.state_dtype)
    return dq, dk, dv, (None if g is None else dg), dbeta, d_init, None, None, None, None, None, None


def _state_launch(opts: GdpOptions, forward: bool) -> dict:
    """Launch overrides of one of the sequential state passes (None keeps a default)."""
    stages = opts.state_fwd_stages if forward else opts.state_bwd_stages
    stages = stages or opts.state_stages
    launch = dict(block_v=opts.state_block_v, num_warps=opts.state_warps, num_stages=stages)
    if forward:
        return launch | dict(lean=opts.sflean, lean_s16=opts.sfs16)
    return launch | dict(lean_w16=opts.sbw16)


def _planes(k: Tensor, lowp: bool, opts: GdpOptions) -> bool:
    """Whether W is stored as planes (``wplanes``): for 16-bit inputs whose W would be fp32."""
    return opts.wplanes and not lowp and k.dtype != torch.float32


def _row_scaled(k: Tensor, lowp: bool, opts: GdpOptions) -> bool:
    """Whether W and U are stored as row-scaled fp16 (``w16``): for 16-bit inputs whose W would be fp32 and
    not planes."""
    return opts.w16 and not lowp and k.dtype != torch.float32 and not _planes(k, lowp, opts)


def _inter_dtype(k: Tensor, lowp: bool) -> torch.dtype:
    """Storage dtype of W, U, δ and the backward's per-step intermediates."""
    return k.dtype if lowp else torch.float32


torch.library.register_autograd("titan_delta::gdp_chunk_fwd", _backward, setup_context=_setup_context)
