"""Greedy incremental decoding over a ``ModelCache``: one prefill, then one token per forward.

Every mixer continues from its cache (KV for attention/SWA, K+U for DeltaFormer, the recurrent state for
Gated DeltaProduct), so generating n tokens after an L-token prompt costs one prefill plus n single-token
steps instead of n full forwards over a growing sequence.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from titan_delta.models.cache import ModelCache

StopFn = Callable[[torch.Tensor], torch.Tensor]  # generated [B, n] -> [B] bool: row is finished
SyncFn = Callable[[bool], bool]  # "this rank wants another step" -> "some rank wants another step"


@torch.no_grad()
def greedy_generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    is_finished: StopFn | None = None,
    any_rank_continues: SyncFn | None = None,
) -> torch.Tensor:
    """Argmax tokens after ``prompt`` [B, T] (every row the same length), [B, n] with n ≤ max_new_tokens.

    Stops when every row is finished (``is_finished``) or has ``max_new_tokens`` tokens. With
    ``any_rank_continues`` (data-parallel eval of a sharded model) a rank that is done keeps stepping while
    another rank still generates, so every rank runs the same number of forwards; the extra tokens are
    cut off here.
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must have shape [B, T] with T >= 1, got {tuple(prompt.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    cache = ModelCache.for_model(model)
    logits = model(prompt, cache=cache)
    generated: list[torch.Tensor] = []
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    while True:
        generated.append(logits[:, -1].float().argmax(dim=-1))
        n = len(generated)
        if n <= max_new_tokens and is_finished is not None:
            finished |= is_finished(torch.stack(generated, dim=1))
        wants_more = n < max_new_tokens and not bool(finished.all())
        if not (wants_more if any_rank_continues is None else any_rank_continues(wants_more)):
            break
        logits = model(generated[-1][:, None], cache=cache)
    return torch.stack(generated, dim=1)[:, :max_new_tokens]
