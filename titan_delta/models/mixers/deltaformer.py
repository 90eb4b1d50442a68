"""DeltaFormer attention mixer: projections, β gate, probe choice, RoPE/NoPE, qk-norm and GQA around the
``titan_delta.ops.deltaformer_attn`` op (stage 1 delta-rule over values, stage 2 causal softmax)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from titan_delta.models.components.norms import RMSNorm
from titan_delta.models.components.qkv import project_qkv
from titan_delta.models.components.rope import RotaryEmbedding
from titan_delta.models.context import MixerContext
from titan_delta.models.flops import deltaformer_flops
from titan_delta.ops import deltaformer_attn

KAPPA_KERNELS = ("softmax", "linear", "relu", "round", "exp")
PROBES = ("q", "k")
BETA_MODES = ("sigmoid", "one", "linear")


@dataclass
class DeltaFormerConfig:
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    kernel: str = "softmax"  # κ1 of stage 1
    probe: str = "q"  # w_t, the stage-1 query: the attention query (op default) or the key (paper listing)
    # "sigmoid": β_t = sigmoid(W_β x_t) per head; "one": β = 1 (no parameters); "linear": β_t = W_β x_t + b,
    # unbounded, as flash-linear-attention's DeltaFormer layer computes it (so its checkpoints import as is)
    beta: str = "sigmoid"
    use_rope: bool = True  # False = NoPE
    rope_theta: float = 10000.0
    qk_norm: bool = False
    norm_eps: float = 1e-6
    backend: str = "auto"  # ops backend


class DeltaFormerAttention(nn.Module):
    def __init__(self, config: DeltaFormerConfig) -> None:
        super().__init__()
        c = config
        if c.kernel not in KAPPA_KERNELS:
            raise ValueError(f"deltaformer_kernel must be one of {KAPPA_KERNELS}, got {c.kernel!r}")
        if c.probe not in PROBES:
            raise ValueError(f"deltaformer_probe must be one of {PROBES}, got {c.probe!r}")
        if c.beta not in BETA_MODES:
            raise ValueError(f"deltaformer_beta must be one of {BETA_MODES}, got {c.beta!r}")
        self.config = c
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)
        self.w_beta = nn.Linear(c.dim, c.n_heads, bias=c.beta == "linear") if c.beta != "one" else None
        self.rope = RotaryEmbedding(c.head_dim, c.rope_theta) if c.use_rope else None
        self.q_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None

    def init_weights(self, init_std: float, out_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv, self.w_beta):
            if linear is not None:
                nn.init.trunc_normal_(linear.weight, std=init_std, a=-3 * init_std, b=3 * init_std)
        nn.init.trunc_normal_(self.wo.weight, std=out_std, a=-3 * out_std, b=3 * out_std)
        if self.w_beta is not None and self.w_beta.bias is not None:
            nn.init.zeros_(self.w_beta.bias)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()

    def core_flops_per_token(self, seq_len: int) -> float:
        c = self.config
        return deltaformer_flops(c.n_heads, c.head_dim, c.head_dim, seq_len)

    def forward(self, x: torch.Tensor, ctx: MixerContext, cache: Any = None) -> torch.Tensor:
        """``cache``: this layer's ``DeltaFormerCache`` (K+U) when decoding incrementally, else None."""
        B, T, _ = x.shape
        c = self.config
        q, k, v, *beta_projection = project_qkv(
            x, ctx, wq=self.wq, wk=self.wk, wv=self.wv,
            n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim,
            q_norm=self.q_norm, k_norm=self.k_norm, rope=self.rope,
            extra=(self.w_beta,) if self.w_beta is not None else (),
        )  # fmt: skip
        if c.n_kv_heads != c.n_heads:  # the op takes one k/v head per query head
            group = c.n_heads // c.n_kv_heads
            k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        beta = None
        if beta_projection:
            beta = beta_projection[0] if c.beta == "linear" else torch.sigmoid(beta_projection[0])
            beta = beta.to(q.dtype)
        if cache is not None:
            o = cache.attend(q, k, v, beta, w=k if c.probe == "k" else None, kernel=c.kernel)
            return self.wo(o.reshape(B, T, c.n_heads * c.head_dim))
        o = deltaformer_attn(
            q, k, v, beta,
            w=k if c.probe == "k" else None,
            kernel=c.kernel,
            cu_seqlens=ctx.cu_seqlens,
            backend=c.backend,
        )  # fmt: skip
        return self.wo(o.reshape(B, T, c.n_heads * c.head_dim))
