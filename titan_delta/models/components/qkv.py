"""The query/key/value preamble shared by the softmax-attention and DeltaFormer mixers.

Both project to heads, optionally RMS-normalise q and k per head, then rotate them with RoPE at the
document-relative positions; keeping it in one place keeps the two mixers' conventions identical.
"""

from __future__ import annotations

import torch
from torch import nn

from titan_delta.models.components.fused_linear import fused_linear
from titan_delta.models.components.rope import RotaryEmbedding, apply_rotary
from titan_delta.models.context import MixerContext


def project_qkv(
    x: torch.Tensor,
    ctx: MixerContext,
    *,
    wq: nn.Linear,
    wk: nn.Linear,
    wv: nn.Linear,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    q_norm: nn.Module | None = None,
    k_norm: nn.Module | None = None,
    rope: RotaryEmbedding | None = None,
    extra: tuple[nn.Linear, ...] = (),
) -> tuple[torch.Tensor, ...]:
    """x [B,T,dim] → q [B,T,n_heads,head_dim], k and v [B,T,n_kv_heads,head_dim], then ``extra``'s
    outputs [B,T,out_features] (e.g. DeltaFormer's β).

    qk-norm applies when both norms are given; RoPE when ``rope`` is given and ``ctx`` has positions (NoPE
    otherwise), with the context's cos/sin table for this head dim and theta when the model made one.
    q, k and ``extra`` come from one GEMM (their outputs are views of it; the norms, RoPE and the ops
    downstream take strided rows); v keeps its own, so that it stays contiguous for the mixer op.
    """
    B, T, _ = x.shape
    q, k, *extra_outputs = fused_linear(x, wq, wk, *extra)
    q = q.view(B, T, n_heads, head_dim)
    k = k.view(B, T, n_kv_heads, head_dim)
    v = wv(x).view(B, T, n_kv_heads, head_dim)
    if q_norm is not None and k_norm is not None:
        q, k = q_norm(q), k_norm(k)
    if rope is not None and ctx.positions is not None:
        table = ctx.rotary.get(rope.key)
        cos, sin = table if table is not None else rope(ctx.positions)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    return q, k, v, *extra_outputs
