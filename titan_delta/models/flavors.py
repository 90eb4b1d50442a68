"""Flavor registry: MODEL_FLAVORS[family][flavor] -> ModelArgs, and builders with field overrides.

Sizes follow flash-linear-attention / flame's 340M and 1.3B configs: d = 1024 / 2048, 24 layers, SwiGLU
width 2816 / 5632, 2048-token context, untied embeddings, attention head dim 64. Gated DeltaProduct layers
use d/256 heads of key dim 128 with Gated-DeltaNet-style value expansion 2 (a 128×256 state per head).
The vocabulary is 16384, the size of the BPE shipped with titan-delta's data pipeline (FLA's configs use
32000: +2·d·15616 parameters); torchtitan's update_from_config replaces it with the tokenizer's anyway.
Hybrids make every third layer SWA.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from titan_delta.models.args import ModelArgs
from titan_delta.models.model import TitanDeltaLM

FAMILIES: dict[str, dict[str, Any]] = {
    "deltaformer": {"mixer": "deltaformer"},
    "gated_deltaproduct": {"mixer": "gated_deltaproduct", "gdp_num_householder": 2},
    "deltaformer_swa": {"mixer": "deltaformer", "layer_pattern": "deltaformer*2,swa"},
    "gated_deltaproduct_swa": {
        "mixer": "gated_deltaproduct",
        "gdp_num_householder": 2,
        "layer_pattern": "gated_deltaproduct*2,swa",
    },
    "transformer": {"mixer": "attention"},
}

SIZES: dict[str, dict[str, Any]] = {
    # seconds on a CPU: tiny widths, 3 layers (one hybrid period), small vocabulary and window
    "debug": {
        "dim": 64, "n_layers": 3, "n_heads": 4, "gdp_n_heads": 2, "gdp_head_dim": 32,
        "vocab_size": 2048, "max_seq_len": 256, "window_size": 64, "multiple_of": 32,
    },
    "340M": {
        "dim": 1024, "n_layers": 24, "n_heads": 16,
        "gdp_n_heads": 4, "gdp_head_dim": 128, "gdp_expand_v": 2.0,
        "vocab_size": 16384, "max_seq_len": 2048, "window_size": 512, "multiple_of": 256,
    },
    "1.3B": {
        "dim": 2048, "n_layers": 24, "n_heads": 32,
        "gdp_n_heads": 8, "gdp_head_dim": 128, "gdp_expand_v": 2.0,
        "vocab_size": 16384, "max_seq_len": 2048, "window_size": 512, "multiple_of": 256,
    },
}  # fmt: skip

MODEL_FLAVORS: dict[str, dict[str, ModelArgs]] = {
    family: {size: ModelArgs(**fields, **family_fields) for size, fields in SIZES.items()}
    for family, family_fields in FAMILIES.items()
}


def get_model_args(family: str, flavor: str, **overrides: Any) -> ModelArgs:
    """A fresh copy of a registered flavor with fields replaced (and re-validated)."""
    if family not in MODEL_FLAVORS:
        raise ValueError(f"unknown model family {family!r}; expected one of {tuple(MODEL_FLAVORS)}")
    if flavor not in MODEL_FLAVORS[family]:
        raise ValueError(
            f"unknown flavor {flavor!r} of {family!r}; expected one of {tuple(MODEL_FLAVORS[family])}"
        )
    known = {f.name for f in dataclasses.fields(ModelArgs)} - {"_enforced"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown ModelArgs field(s) {unknown}; valid fields: {sorted(known)}")
    return dataclasses.replace(MODEL_FLAVORS[family][flavor], **overrides)


def build_model(family: str, flavor: str, **overrides: Any) -> TitanDeltaLM:
    """Build and initialise a model, e.g. ``build_model("deltaformer", "debug", n_layers=2)``."""
    return TitanDeltaLM(get_model_args(family, flavor, **overrides))
