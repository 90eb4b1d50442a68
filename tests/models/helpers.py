"""Tiny configurations shared by the model tests."""

from __future__ import annotations

from typing import Any

import torch

from titan_delta.models import ModelArgs, TitanDeltaLM

TINY: dict[str, Any] = {
    "dim": 32,
    "n_layers": 1,
    "vocab_size": 97,
    "n_heads": 4,
    "gdp_n_heads": 2,
    "multiple_of": 16,
    "window_size": 8,
    "max_seq_len": 64,
    "op_backend": "torch",
    "attn_backend": "sdpa",
}

MIXERS = ("attention", "swa", "deltaformer", "gated_deltaproduct")


def tiny_args(**overrides: Any) -> ModelArgs:
    return ModelArgs(**{**TINY, **overrides})


def tiny_model(dtype: torch.dtype = torch.float32, **overrides: Any) -> TitanDeltaLM:
    return TitanDeltaLM(tiny_args(**overrides)).to(dtype)
