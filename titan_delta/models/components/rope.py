"""Rotary position embeddings (half-split convention) evaluated at arbitrary positions.

Angles are computed from the position ids instead of gathered from a precomputed table: that keeps the
module buffer-free (nothing to re-materialise after meta-device init) and supports positions that restart
at every packed document without a host sync.

The model evaluates cos/sin once per forward for every (head_dim, theta) its layers use and hands them to
the mixers in ``MixerContext.rotary``. Why: inside a compiled block inductor fuses the angle computation
into the rotation, so every head of q and k, forward and backward, re-evaluated pow, sin and cos per
element, which made the rotation one of the costliest elementwise kernels of a training step.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Produces (cos, sin) of shape [B, T, 1, head_dim/2] for ``position_ids`` [B, T]."""

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
        self.head_dim = head_dim
        self.theta = theta

    @property
    def key(self) -> tuple[int, float]:
        """What the tables depend on besides the positions: layers with equal keys share one table."""
        return self.head_dim, float(self.theta)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = self.head_dim // 2
        exponent = torch.arange(half, device=position_ids.device, dtype=torch.float32) / half
        inv_freq = torch.pow(self.theta, -exponent)
        angles = position_ids.to(torch.float32).unsqueeze(-1) * inv_freq  # [B, T, half]
        return angles.cos().unsqueeze(2), angles.sin().unsqueeze(2)


def rotary_tables(
    modules: list[RotaryEmbedding], position_ids: torch.Tensor
) -> dict[tuple[int, float], tuple[torch.Tensor, torch.Tensor]]:
    """(cos, sin) for ``position_ids`` per distinct ``key`` of ``modules``."""
    tables: dict[tuple[int, float], tuple[torch.Tensor, torch.Tensor]] = {}
    for module in modules:
        if module.key not in tables:
            tables[module.key] = module(position_ids)
    return tables


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., i], x[..., i + D/2]) of ``x`` [B, T, H, D] by the position angles (fp32+ math)."""
    x1, x2 = x.to(torch.promote_types(x.dtype, torch.float32)).chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)
