"""Rotary position embeddings (half-split convention) evaluated at arbitrary positions.

Angles are computed from the position ids on the fly instead of gathered from a precomputed table: that
keeps the module buffer-free (nothing to re-materialise after meta-device init) and supports positions
that restart at every packed document without a host sync.
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

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = self.head_dim // 2
        exponent = torch.arange(half, device=position_ids.device, dtype=torch.float32) / half
        inv_freq = torch.pow(self.theta, -exponent)
        angles = position_ids.to(torch.float32).unsqueeze(-1) * inv_freq  # [B, T, half]
        return angles.cos().unsqueeze(2), angles.sin().unsqueeze(2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., i], x[..., i + D/2]) of ``x`` [B, T, H, D] by the position angles (fp32+ math)."""
    x1, x2 = x.to(torch.promote_types(x.dtype, torch.float32)).chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)
