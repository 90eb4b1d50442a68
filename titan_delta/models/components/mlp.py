"""SwiGLU feed-forward: w2(SiLU(w1 x) · w3 x)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def swiglu_hidden_dim(dim: int, hidden_ratio: float = 4.0, multiple_of: int = 256) -> int:
    """2/3 · hidden_ratio · dim rounded up to ``multiple_of``: the SwiGLU width with the parameter
    budget of a ``hidden_ratio``× GELU MLP (d=1024 → 2816, d=2048 → 5632 with the defaults)."""
    hidden = int(2 * hidden_ratio * dim / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def init_weights(self, init_std: float, out_std: float) -> None:
        """``out_std`` (depth-scaled) for the projection back into the residual stream."""
        for linear in (self.w1, self.w3):
            nn.init.trunc_normal_(linear.weight, std=init_std, a=-3 * init_std, b=3 * init_std)
        nn.init.trunc_normal_(self.w2.weight, std=out_std, a=-3 * out_std, b=3 * out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
