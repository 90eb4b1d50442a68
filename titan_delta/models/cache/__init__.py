"""Incremental-decoding caches: KV (attention/SWA), K+U (DeltaFormer), state (Gated DeltaProduct)."""

from titan_delta.models.cache.attention_cache import AttentionCache
from titan_delta.models.cache.deltaformer_cache import DeltaFormerCache
from titan_delta.models.cache.model_cache import ModelCache
from titan_delta.models.cache.recurrent_cache import GatedDeltaProductCache

__all__ = ["AttentionCache", "DeltaFormerCache", "GatedDeltaProductCache", "ModelCache"]
