"""Triton gated RMSNorm (Gated DeltaProduct's output norm): y = RMSNorm(x) · weight · SiLU(gate) per head."""

from titan_delta_kernels.gated_rmsnorm.op import gated_rmsnorm

__all__ = ["gated_rmsnorm"]
