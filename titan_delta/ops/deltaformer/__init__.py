"""DeltaFormer attention: u_t = v_t − β_t Σ_{i<t} κ1(w_t, k_i) u_i, then o = causal softmax(q·kᵀ)·U."""

from titan_delta.ops.deltaformer.api import deltaformer_attn
from titan_delta.ops.deltaformer.reference import (
    KERNELS,
    deltaformer_attn_chunked,
    deltaformer_attn_recurrent,
    deltaformer_stage1_chunked,
    deltaformer_stage1_recurrent,
)

__all__ = [
    "KERNELS",
    "deltaformer_attn",
    "deltaformer_attn_chunked",
    "deltaformer_attn_recurrent",
    "deltaformer_stage1_chunked",
    "deltaformer_stage1_recurrent",
]
