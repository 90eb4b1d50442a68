"""Triton kernels for DeltaFormer attention (κ1 = softmax): forward, backward, varlen, any length."""

from titan_delta_kernels.deltaformer.op import deltaformer_attn_triton

__all__ = ["deltaformer_attn_triton"]
