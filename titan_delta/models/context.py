"""Per-forward information every mixer may need, computed once by the model (not per layer).

Batch contract (from the data loader): when document masking is on, ``cu_seqlens`` holds offsets into the
flattened B·T token stream, every row start also being a boundary. The model then runs all mixers on the
[1, B·T] view. Document ids and positions-in-document are derived on device with ``searchsorted`` so no
host synchronisation happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def document_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """[total] long: index of the document each flattened token belongs to."""
    tokens = torch.arange(total, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens, tokens, right=True) - 1


def positions_in_documents(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """[total] long: offset of each flattened token from the start of its document (restarts at 0)."""
    doc = document_ids(cu_seqlens, total)
    tokens = torch.arange(total, device=cu_seqlens.device, dtype=torch.long)
    return tokens - cu_seqlens.to(torch.long)[doc]


@dataclass
class MixerContext:
    """What a mixer sees besides its input ``x`` [B', T', dim] (B' = 1, T' = B·T when packed).

    cu_seqlens: document offsets into the flattened stream, or None (each row is one sequence).
    seq_pos: [B', T'] position inside the document (None without cu_seqlens): the short conv masks with it.
    positions: [B', T'] RoPE position ids (restarting per document unless the caller gave its own). Kept
        as integers so mixed-precision input casting never rounds rotary angles; each RoPE mixer turns
        them into cos/sin for its own head dim.
    rotary: (cos, sin) of ``positions`` per (head_dim, theta) of the layers' RoPE, computed once per
        forward by the model (``components.rope`` says why); a mixer called without it computes its own.
    attn_masks: per attention window (None = full causal) the mask object the attention backend consumes
        (a FlexAttention BlockMask, a dense bool mask, or None for plain causal SDPA).
    cache: decoding state (see ``titan_delta.models.decoding``); each block hands its layer's entry to its
        mixer. None for training and scoring, which leaves every mixer on its full-sequence path.
    """

    cu_seqlens: torch.Tensor | None = None
    seq_pos: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    rotary: dict[tuple[int, float], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    attn_masks: dict[int | None, Any] = field(default_factory=dict)
    cache: Any = None  # a titan_delta.models.cache.ModelCache during incremental decoding, else None
