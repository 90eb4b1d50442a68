"""A zoo model sized for a task: the task's vocabulary, a context covering the longest evaluation, and
NoPE through the model's own switches (``attn_rope`` for softmax attention/SWA, ``deltaformer_rope``)."""

from __future__ import annotations

from titan_delta.models import ModelArgs, TitanDeltaLM
from titan_delta.state_tracking.config import ModelConfig

NOPE_FIELDS = ("attn_rope", "deltaformer_rope")  # every ModelArgs switch that turns rotary embeddings off


def task_model_args(config: ModelConfig, vocab_size: int, max_tokens: int) -> ModelArgs:
    """ModelArgs from ``[model]``; ``rope = false`` turns every mixer's RoPE off (GDP has none anyway)."""
    args = dict(config.args)
    if not config.rope:
        args.update(dict.fromkeys(NOPE_FIELDS, False))
    try:
        return ModelArgs(vocab_size=vocab_size, max_seq_len=max_tokens, **args)
    except (TypeError, ValueError) as error:
        raise ValueError(f"[model]: {error}") from error


def build_task_model(config: ModelConfig, vocab_size: int, max_tokens: int) -> TitanDeltaLM:
    return TitanDeltaLM(task_model_args(config, vocab_size, max_tokens))
