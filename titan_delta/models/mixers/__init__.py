"""Sequence mixers, one per file, each an nn.Module with a small dataclass config."""

from titan_delta.models.mixers.attention import AttentionConfig, SoftmaxAttention
from titan_delta.models.mixers.deltaformer import DeltaFormerAttention, DeltaFormerConfig
from titan_delta.models.mixers.gated_deltaproduct import GatedDeltaProduct, GatedDeltaProductConfig
from titan_delta.models.mixers.registry import MIXER_BUILDERS, MIXER_NAMES, build_mixer

__all__ = [
    "MIXER_BUILDERS",
    "MIXER_NAMES",
    "AttentionConfig",
    "DeltaFormerAttention",
    "DeltaFormerConfig",
    "GatedDeltaProduct",
    "GatedDeltaProductConfig",
    "SoftmaxAttention",
    "build_mixer",
]
