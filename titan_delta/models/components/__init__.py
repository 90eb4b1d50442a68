"""Building blocks shared by the mixers: norms, rotary embeddings, SwiGLU MLP, short causal convolution."""

from titan_delta.models.components.mlp import SwiGLU, swiglu_hidden_dim
from titan_delta.models.components.norms import GatedRMSNorm, RMSNorm
from titan_delta.models.components.rope import RotaryEmbedding, apply_rotary
from titan_delta.models.components.short_conv import ShortCausalConv

__all__ = [
    "GatedRMSNorm",
    "RMSNorm",
    "RotaryEmbedding",
    "ShortCausalConv",
    "SwiGLU",
    "apply_rotary",
    "swiglu_hidden_dim",
]
