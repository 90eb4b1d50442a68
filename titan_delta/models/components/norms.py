"""RMSNorm and the gated RMSNorm used on Gated DeltaProduct outputs.

The statistics are computed in fp32 whatever the activation dtype, because bf16 sums of squares over
1–2k channels lose enough precision to shift the scale noticeably.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)  # fp32 for bf16/fp16, fp64 stays fp64


def _rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(_compute_dtype(x))
    return xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """y = x / rms(x) · weight over the last dimension."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_rms_normalize(x, self.eps) * self.weight.to(_compute_dtype(x))).to(x.dtype)


class GatedRMSNorm(RMSNorm):
    """y = RMSNorm(x) · weight · SiLU(gate): the output gate of Gated DeltaNet / DeltaProduct."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        dtype = _compute_dtype(x)
        y = _rms_normalize(x, self.eps) * self.weight.to(dtype) * F.silu(gate.to(dtype))
        return y.to(x.dtype)
