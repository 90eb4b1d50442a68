"""Tiny models for the eval tests (fp64 where logits are compared with hand computations)."""

from __future__ import annotations

from typing import Any

import torch

from titan_delta.models import ModelArgs, TitanDeltaLM

TINY: dict[str, Any] = {
    "dim": 32, "n_layers": 3, "n_heads": 4, "gdp_n_heads": 2, "multiple_of": 16, "window_size": 4,
    "vocab_size": 97, "max_seq_len": 64, "op_backend": "torch", "attn_backend": "sdpa",
}  # fmt: skip
HYBRID = {"layer_pattern": "deltaformer,swa,gated_deltaproduct"}


def tiny_model(dtype: torch.dtype = torch.float64, **overrides: Any) -> TitanDeltaLM:
    return TitanDeltaLM(ModelArgs(**{**TINY, **overrides})).to(dtype).eval()


class Request:
    """Stand-in for lm-eval's Instance: the adapter only reads ``args``."""

    def __init__(self, *args: Any) -> None:
        self.args = args
