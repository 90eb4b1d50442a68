"""Logits for Hugging Face-style calls: a batch with an ``attention_mask`` (padding) and an optional cache.

titan-delta models take no padding mask: every mixer reads all earlier tokens of its row, and for the
recurrent and DeltaFormer mixers a pad token cannot be "masked out" afterwards, it has already changed the
state. So a batch whose mask has zeros runs row by row on each row's real tokens only (pads are skipped,
RoPE positions count real tokens, as Hugging Face's ``position_ids = cumsum(mask) - 1`` convention does),
each row with its own cache when decoding. Logits at pad positions are zero. A batch without padding (or
with an all-ones mask) runs as one batch, as ``TitanDeltaLM`` does.

Right padding never changes the logits of real tokens (the model is causal), which is why lm-eval's
scoring batches need no mask at all; left padding, which ``generate`` uses for prompts of different
lengths, does, and takes the row-by-row path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from titan_delta.models.cache import ModelCache

LMForward = Callable[..., torch.Tensor]  # (tokens [B, T], cache=ModelCache | None) -> logits [B, T, V]


class RowCaches:
    """Decoding state of a padded batch: one ``ModelCache`` per row, fed only that row's real tokens.

    ``seen`` counts columns (pads included), like ``ModelCache.seen`` does for an unpadded batch, so a
    caller can always slice the new tokens as ``input_ids[:, cache.seen:]``."""

    def __init__(self, rows: list[ModelCache]) -> None:
        self.rows = rows
        self.seen = 0


def _rows_have_padding(mask: torch.Tensor | None) -> bool:
    return mask is not None and not bool(mask.bool().all())


def new_cache(model: nn.Module, batch: int, mask: torch.Tensor | None) -> ModelCache | RowCaches:
    """An empty cache for the next call: per row when the first call is padded, else one for the batch."""
    if _rows_have_padding(mask):
        return RowCaches([ModelCache.for_model(model) for _ in range(batch)])
    return ModelCache.for_model(model)


def causal_lm_logits(
    forward: LMForward,
    tokens: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: ModelCache | RowCaches | None,
) -> torch.Tensor:
    """Logits [B, T, V] of ``tokens`` [B, T]; ``attention_mask`` [B, ≥ T] (Hugging Face passes the mask of
    the cached tokens too: its last T columns belong to ``tokens``). Advances ``cache`` when given."""
    mask = None if attention_mask is None else attention_mask[:, -tokens.shape[1] :]
    if isinstance(cache, RowCaches):
        logits = _row_by_row(forward, tokens, mask, cache.rows)
        cache.seen += tokens.shape[1]
        return logits
    if _rows_have_padding(mask):
        if cache is not None and cache.seen > 0:
            raise ValueError(
                "attention_mask has padding but decoding began without it: start the cache from a padded "
                "prompt (or leave the mask out) so each row gets its own state"
            )
        return _row_by_row(forward, tokens, mask, None)
    return forward(tokens, cache=cache)


def _row_by_row(
    forward: LMForward, tokens: torch.Tensor, mask: torch.Tensor | None, caches: list[ModelCache] | None
) -> torch.Tensor:
    B, T = tokens.shape
    logits: torch.Tensor | None = None
    for b in range(B):
        real = torch.ones(T, dtype=torch.bool, device=tokens.device) if mask is None else mask[b].bool()
        n = int(real.sum())
        if n == 0:  # nothing of this row in this call (a fully padded row): its state does not move
            continue
        row = forward(tokens[b, real][None], cache=None if caches is None else caches[b])[0]
        if logits is None:
            logits = row.new_zeros(B, T, row.shape[-1])
        logits[b, real] = row
    if logits is None:
        raise ValueError("attention_mask masks every token of the batch: nothing to run")
    return logits
