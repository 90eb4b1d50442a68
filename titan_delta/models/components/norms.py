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


def _gated_kernel():
    """The Triton op ``titan_delta_kernels.gated_rmsnorm``, imported lazily (the model must work where Triton
    is unavailable); None without it."""
    try:
        from titan_delta_kernels.gated_rmsnorm import gated_rmsnorm
    except ImportError:
        return None
    return gated_rmsnorm


def _gated_kernel_applies(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor) -> bool:
    """Where the Triton op runs: CUDA tensors of its dtypes and widths (tests patch this to run it on CPU
    under TRITON_INTERPRET=1)."""
    if not x.is_cuda or x.dim() < 2 or gate.shape != x.shape:
        return False
    try:
        from titan_delta_kernels.gated_rmsnorm.op import KERNEL_DTYPES, MAX_WIDTH
    except ImportError:
        return False
    dtypes_ok = all(t.dtype in KERNEL_DTYPES for t in (x, gate, weight))
    return dtypes_ok and x.shape[-1] <= MAX_WIDTH


class GatedRMSNorm(RMSNorm):
    """y = RMSNorm(x) · weight · SiLU(gate): the output gate of Gated DeltaNet / DeltaProduct. On CUDA the
    Triton op ``titan_delta_kernels.gated_rmsnorm`` (same maths, one pass each way); ``forward_torch`` is its
    reference and the CPU path."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        kernel = _gated_kernel() if _gated_kernel_applies(x, gate, self.weight) else None
        if kernel is not None:
            return kernel(x, gate, self.weight, self.eps)
        return self.forward_torch(x, gate)

    def forward_torch(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = _compute_dtype(x)
        y = _rms_normalize(x, self.eps) * self.weight.to(dtype) * F.silu(gate.to(dtype))
        return y.to(x.dtype)
