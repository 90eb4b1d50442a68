"""DeltaFormer attention: u_t = v_t − β_t Σ_{i<t} κ1(w_t, k_i) u_i, then o = causal softmax(q·kᵀ)·U."""

from titan_delta.ops.deltaformer.api import deltaformer_attn

__all__ = ["deltaformer_attn"]
