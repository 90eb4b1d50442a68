"""A zoo model sized for a task: the task's vocabulary, a context covering the longest evaluation, and
NoPE by feeding every RoPE mixer position 0 (a rotation by angle 0 is the identity)."""

from __future__ import annotations

import torch

from titan_delta.models import ModelArgs, TitanDeltaLM
from titan_delta.state_tracking.config import ModelConfig


def build_task_model(config: ModelConfig, vocab_size: int, max_tokens: int) -> TitanDeltaLM:
    args = dict(config.args)
    if not config.rope:
        args["deltaformer_rope"] = False
    try:
        model_args = ModelArgs(vocab_size=vocab_size, max_seq_len=max_tokens, **args)
    except (TypeError, ValueError) as error:
        raise ValueError(f"[model]: {error}") from error
    return TitanDeltaLM(model_args)


def position_ids_for(config: ModelConfig, inputs: torch.Tensor) -> torch.Tensor | None:
    """None (the model's own 0..T-1) with RoPE; all zeros for NoPE."""
    return None if config.rope else torch.zeros_like(inputs)
