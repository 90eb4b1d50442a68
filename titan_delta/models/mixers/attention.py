"""Softmax attention mixer: full causal (the Transformer baseline) or sliding-window (SWA) with RoPE, GQA
and optional qk-RMSNorm. The mask (window, documents) comes prebuilt in the MixerContext."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from titan_delta.models.components.norms import RMSNorm
from titan_delta.models.components.qkv import project_qkv
from titan_delta.models.components.rope import RotaryEmbedding
from titan_delta.models.context import MixerContext
from titan_delta.models.flops import softmax_attention_flops
from titan_delta.models.mixers.attention_masks import flex_attention_fn, flex_kernel_options


@dataclass
class AttentionConfig:
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    window: int | None = None  # None = full causal attention; else each query sees its last `window` keys
    qk_norm: bool = False
    use_rope: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6


class SoftmaxAttention(nn.Module):
    """o = W_o · softmax(q kᵀ / √D + mask) v, k/v heads shared by groups of n_heads / n_kv_heads queries."""

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.window = c.window
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)
        self.rope = RotaryEmbedding(c.head_dim, c.rope_theta) if c.use_rope else None
        self.q_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None

    def init_weights(self, init_std: float, out_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, std=init_std, a=-3 * init_std, b=3 * init_std)
        nn.init.trunc_normal_(self.wo.weight, std=out_std, a=-3 * out_std, b=3 * out_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()

    def core_flops_per_token(self, seq_len: int) -> float:
        c = self.config
        return softmax_attention_flops(c.n_heads, c.head_dim, c.head_dim, seq_len, c.window)

    def forward(self, x: torch.Tensor, ctx: MixerContext, cache: Any = None) -> torch.Tensor:
        """``cache``: this layer's ``AttentionCache`` when decoding incrementally, else None."""
        B, T, _ = x.shape
        c = self.config
        q, k, v = project_qkv(
            x, ctx, wq=self.wq, wk=self.wk, wv=self.wv,
            n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim,
            q_norm=self.q_norm, k_norm=self.k_norm, rope=self.rope,
        )  # fmt: skip
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if cache is not None:
            o = cache.attend(q, k, v)
            return self.wo(o.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim))
        mask = ctx.attn_masks.get(self.window)
        gqa = c.n_kv_heads != c.n_heads
        if isinstance(mask, BlockMask):
            o = flex_attention_fn(x.device)(q, k, v, block_mask=mask, enable_gqa=gqa,
                                            kernel_options=flex_kernel_options(c.head_dim, x.device))
        elif mask is None:
            if self.window is not None:
                raise RuntimeError(f"no attention mask was built for window {self.window}")
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.wo(o.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim))
