"""Triton short causal depthwise convolution (width ≤ 8, optional SiLU, document-aware) with its backward."""

from titan_delta_kernels.short_conv.conv import short_causal_conv

__all__ = ["short_causal_conv"]
