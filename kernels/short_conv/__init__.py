"""Triton short causal depthwise convolution (width ≤ 8, optional SiLU, document-aware) with its backward;
several convs over consecutive channel ranges of one tensor (one GEMM's output) as one op."""

from titan_delta_kernels.short_conv.conv import short_causal_conv, short_causal_conv_split

__all__ = ["short_causal_conv", "short_causal_conv_split"]
