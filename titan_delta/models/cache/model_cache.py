"""Decoding state of a whole model: one cache per layer, matched to the layer's mixer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from titan_delta.models.block import DecoderBlock
from titan_delta.models.cache.attention_cache import AttentionCache
from titan_delta.models.cache.deltaformer_cache import DeltaFormerCache
from titan_delta.models.cache.recurrent_cache import GatedDeltaProductCache
from titan_delta.models.mixers.attention import SoftmaxAttention
from titan_delta.models.mixers.deltaformer import DeltaFormerAttention
from titan_delta.models.mixers.gated_deltaproduct import GatedDeltaProduct

if TYPE_CHECKING:
    LayerCache = AttentionCache | DeltaFormerCache | GatedDeltaProductCache


def _layer_cache(mixer: nn.Module) -> LayerCache:
    if isinstance(mixer, SoftmaxAttention):
        return AttentionCache(window=mixer.window)
    if isinstance(mixer, DeltaFormerAttention):
        return DeltaFormerCache()
    if isinstance(mixer, GatedDeltaProduct):
        return GatedDeltaProductCache()
    raise TypeError(f"no decoding cache for mixer type {type(mixer).__name__}")


class ModelCache:
    """Pass as ``model(tokens, cache=cache)``: each call continues the sequences of the previous ones.

    Rows of a batch advance together (every call appends the same number of tokens to each row).
    """

    def __init__(self, layers: dict[int, LayerCache]) -> None:
        self.layers = layers
        self.seen = 0  # tokens per row processed so far = RoPE position of the next token

    @classmethod
    def for_model(cls, model: nn.Module) -> ModelCache:
        """Empty caches for every decoder block of ``model`` (found through compile/AC/FSDP wrappers)."""
        blocks = [m for m in model.modules() if isinstance(m, DecoderBlock)]
        if not blocks:
            raise TypeError(f"{type(model).__name__} has no DecoderBlock: not a titan-delta model")
        return cls({block.layer_id: _layer_cache(block.mixer) for block in blocks})

    def layer(self, layer_id: int) -> LayerCache:
        if layer_id not in self.layers:
            raise KeyError(f"cache has no entry for layer {layer_id}; build it with ModelCache.for_model")
        return self.layers[layer_id]
