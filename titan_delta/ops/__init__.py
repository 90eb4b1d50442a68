"""Public ops: pure-PyTorch references with Triton kernels behind ``backend="auto"|"triton"``."""

from titan_delta.ops.deltaformer import deltaformer_attn
from titan_delta.ops.gated_delta_product import gated_delta_product

__all__ = ["deltaformer_attn", "gated_delta_product"]
