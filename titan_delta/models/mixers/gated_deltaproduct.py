"""Gated DeltaProduct mixer (Siems et al.): n_h keys/values/β per token, Mamba2-style forget gate,
short causal convs, L2-normalised q/k and a gated RMSNorm output, around
``titan_delta.ops.gated_delta_product``.

The forget gate, the short convs and the output gate can each be switched off, as the DeltaProduct
paper's state-tracking runs do: no gate means g = None (pure products of Householder-like steps), no
convs means q, k, v = SiLU(projection) (the activation the convs end with), no output gate means a plain
RMSNorm of each head's output."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from titan_delta.models.components.fused_linear import fused_linear_joined
from titan_delta.models.components.norms import GatedRMSNorm, RMSNorm
from titan_delta.models.components.short_conv import ShortCausalConv, l2_normalize_groups, short_convs
from titan_delta.models.context import MixerContext
from titan_delta.models.flops import gated_deltaproduct_flops
from titan_delta.ops import gated_delta_product


@dataclass
class GatedDeltaProductConfig:
    dim: int
    n_heads: int
    head_dim: int  # key/query dim K per head
    head_v_dim: int  # value dim V per head
    num_householder: int = 2
    allow_neg_eigval: bool = False  # β = 2·sigmoid ∈ (0, 2): Householder steps with negative eigenvalues
    conv_size: int = 4
    use_forget_gate: bool = True
    use_short_conv: bool = True
    use_output_gate: bool = True
    norm_eps: float = 1e-6
    backend: str = "auto"
    # Mamba2 initialisation of the gate: A ~ U[1, 16], dt log-uniform in [dt_min, dt_max]
    a_init_range: tuple[float, float] = (1.0, 16.0)
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    dt_init_floor: float = 1e-4


class GatedDeltaProduct(nn.Module):
    def __init__(self, config: GatedDeltaProductConfig) -> None:
        super().__init__()
        c = config
        if c.num_householder < 1:
            raise ValueError(f"gdp_num_householder must be >= 1, got {c.num_householder}")
        if c.conv_size < 1:
            raise ValueError(f"gdp_conv_size must be >= 1, got {c.conv_size}")
        self.config = c
        n, H, K, V = c.num_householder, c.n_heads, c.head_dim, c.head_v_dim
        self.q_proj = nn.Linear(c.dim, H * K, bias=False)
        self.k_proj = nn.Linear(c.dim, n * H * K, bias=False)
        self.v_proj = nn.Linear(c.dim, n * H * V, bias=False)
        self.b_proj = nn.Linear(c.dim, n * H, bias=False)
        self.o_proj = nn.Linear(H * V, c.dim, bias=False)
        if c.use_forget_gate:
            self.a_proj = nn.Linear(c.dim, H, bias=False)
            self.A_log = nn.Parameter(torch.empty(H))
            self.dt_bias = nn.Parameter(torch.empty(H))
            self.A_log._no_weight_decay = True  # optimizers may read this flag, as FLA's trainer does
            self.dt_bias._no_weight_decay = True
        if c.use_short_conv:
            # the convs of q and k end with the L2 normalisation of every head (fused into the conv's passes)
            self.q_conv = ShortCausalConv(H * K, c.conv_size, l2_group=K)
            self.k_conv = ShortCausalConv(n * H * K, c.conv_size, l2_group=K)
            self.v_conv = ShortCausalConv(n * H * V, c.conv_size)
        if c.use_output_gate:
            self.g_proj = nn.Linear(c.dim, H * V, bias=False)
            self.o_norm: nn.Module = GatedRMSNorm(V, c.norm_eps)
        else:
            self.o_norm = RMSNorm(V, c.norm_eps)
        self._init_gate()

    def _init_gate(self) -> None:
        c = self.config
        if not c.use_forget_gate:
            return
        with torch.no_grad():
            A = torch.empty_like(self.A_log, dtype=torch.float32).uniform_(*c.a_init_range)
            self.A_log.copy_(torch.log(A))
            log_dt = torch.empty_like(self.dt_bias, dtype=torch.float32).uniform_(
                math.log(c.dt_min), math.log(c.dt_max)
            )
            dt = torch.exp(log_dt).clamp(min=c.dt_init_floor)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)

    def init_weights(self, init_std: float, out_std: float) -> None:
        for name in ("q_proj", "k_proj", "v_proj", "b_proj", "a_proj", "g_proj"):
            linear = getattr(self, name, None)
            if linear is not None:
                nn.init.trunc_normal_(linear.weight, std=init_std, a=-3 * init_std, b=3 * init_std)
        nn.init.trunc_normal_(self.o_proj.weight, std=out_std, a=-3 * out_std, b=3 * out_std)
        if self.config.use_short_conv:
            for conv in (self.q_conv, self.k_conv, self.v_conv):
                conv.reset_parameters()
        self.o_norm.reset_parameters()
        self._init_gate()

    def core_flops_per_token(self, seq_len: int) -> float:
        c = self.config
        return gated_deltaproduct_flops(c.n_heads, c.head_dim, c.head_v_dim, c.num_householder)

    def forward(self, x: torch.Tensor, ctx: MixerContext, cache: Any = None) -> torch.Tensor:
        """``cache``: this layer's ``GatedDeltaProductCache`` (state + conv history) when decoding."""
        B, T, _ = x.shape
        c = self.config
        n, H, K, V = c.num_householder, c.n_heads, c.head_dim, c.head_v_dim
        q, k, v, signals = self._project(x, ctx, cache)  # q and k L2-normalised per head
        q, k, v = q.view(B, T, H, K), k.view(B, T * n, H, K), v.view(B, T * n, H, V)  # step j of t at t·n + j
        beta = torch.sigmoid(signals[..., : n * H]).reshape(B, T * n, H)
        if c.allow_neg_eigval:
            beta = beta * 2.0
        g = None
        if c.use_forget_gate:
            gate_dtype = torch.promote_types(x.dtype, torch.float32)  # the log-gate is summed over T: ≥ fp32
            dt = F.softplus(signals[..., n * H : (n + 1) * H].to(gate_dtype) + self.dt_bias.to(gate_dtype))
            g = -self.A_log.to(gate_dtype).exp() * dt
        if cache is None:
            o, _ = gated_delta_product(
                q, k, v, g, beta, num_householder=n, cu_seqlens=ctx.cu_seqlens, backend=c.backend
            )
        else:
            o = cache.recur(q, k, v, g, beta, num_householder=n, backend=c.backend)
        o = self.o_norm(o, self.g_proj(x).view(B, T, H, V)) if c.use_output_gate else self.o_norm(o)
        return self.o_proj(o.reshape(B, T, H * V))

    def _project(
        self, x: torch.Tensor, ctx: MixerContext, cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v, signals): q, k, v as [B, T, channels] in one dtype, projections through the short convs
        (continuing the cache's history when decoding) or SiLU of the projections when the convs are off, q
        and k with every head L2-normalised; ``signals`` [B, T, ≥ n·H] β's logits, then (with the forget gate)
        the decay's H dt columns, then padding.

        Training and prefill without a cache project q, k, v, β and dt with one GEMM. With the convs, one op
        convolves its q, k and v channels and passes β's and dt's through, so the op's backward writes the
        GEMM's whole input gradient: separate projections would each add a [tokens, dim] gradient to be
        summed, and narrow ones split off the GEMM a concatenation of the pieces' gradients. The output gate
        is its own GEMM: its gradient, from the gated RMSNorm's backward, then feeds the GEMM as it is."""
        c = self.config
        n, H, K, V = c.num_householder, c.n_heads, c.head_dim, c.head_v_dim
        signal_linears = [self.b_proj] + ([self.a_proj] if c.use_forget_gate else [])
        widths = [H * K, n * H * K, n * H * V]
        if cache is None:
            projections = (self.q_proj, self.k_proj, self.v_proj, *signal_linears)
            joined = fused_linear_joined(x, *projections, padded=True)
            passthrough = joined.shape[-1] - sum(widths)
            if c.use_short_conv:
                convs = (self.q_conv, self.k_conv, self.v_conv)
                q, k, v, signals = short_convs(joined, convs, ctx.seq_pos, passthrough)
                return q, k, v, signals
            q, k, v, signals = joined.split([*widths, passthrough], dim=-1)
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
            return l2_normalize_groups(q, K), l2_normalize_groups(k, K), v, signals
        signals = fused_linear_joined(x, *signal_linears)
        projections = {"q": self.q_proj(x), "k": self.k_proj(x), "v": self.v_proj(x)}
        if not c.use_short_conv:
            q, k, v = (F.silu(p) for p in projections.values())
            return l2_normalize_groups(q, K), l2_normalize_groups(k, K), v, signals
        convs = {"q": self.q_conv, "k": self.k_conv, "v": self.v_conv}
        q, k, v = (cache.convolve(name, convs[name], p) for name, p in projections.items())
        return q, k, v, signals
