"""Packing rows of ``seq_len + 1`` tokens into ``(input, labels, cu_seqlens)`` batches.

A row holds ``seq_len + 1`` consecutive stream tokens: inputs are the first ``seq_len``, labels the last
``seq_len``; the next row starts at the row's last token, so every token is an input exactly once.
Documents are ``[BOS] + text + [EOS]``. With document masking the label of a position whose next token
starts a new document (the EOS position) is ``IGNORE_INDEX``: the token before EOS still learns to
predict EOS, but nothing learns to predict the first token of an unrelated document. Every row start and
every document start inside a row is a ``cu_seqlens`` boundary, offset into the flattened ``B·T`` stream.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torchtitan.components.loss import IGNORE_INDEX


def row_targets(row: np.ndarray, doc_starts: Sequence[int], masking: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, segment_starts)`` of one row; ``doc_starts`` = row positions where a document begins."""
    seq_len = len(row) - 1
    labels = row[1:].astype(np.int64, copy=True)
    if not masking:
        return labels, np.zeros(1, dtype=np.int64)
    starts = np.asarray(doc_starts, dtype=np.int64)
    labels[starts[starts >= 1] - 1] = IGNORE_INDEX
    inner = starts[(starts > 0) & (starts < seq_len)]
    return labels, np.concatenate([np.zeros(1, dtype=np.int64), inner])


def collate_rows(rows: Sequence[np.ndarray], doc_starts: Sequence[Sequence[int]],
                 masking: bool) -> dict[str, torch.Tensor]:
    """Stack rows into ``{"input", "labels"[, "cu_seqlens"]}`` (cu_seqlens int32 over the flat B·T)."""
    seq_len = len(rows[0]) - 1
    inputs = np.stack([r[:-1] for r in rows]).astype(np.int64)
    labels, segments = [], []
    for b, (row, starts) in enumerate(zip(rows, doc_starts, strict=True)):
        row_labels, row_segments = row_targets(row, starts, masking)
        labels.append(row_labels)
        segments.append(row_segments + b * seq_len)
    batch = {"input": torch.from_numpy(inputs), "labels": torch.from_numpy(np.stack(labels))}
    if masking:
        cu = np.concatenate([*segments, np.array([len(rows) * seq_len])])
        batch["cu_seqlens"] = torch.from_numpy(cu.astype(np.int32))
    return batch


def position_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    """``[B, T]`` positions restarting at 0 at every segment (for models that take position ids)."""
    total = batch * seq_len
    starts = torch.zeros(total, dtype=torch.long, device=cu_seqlens.device)
    bounds = cu_seqlens[:-1].long()
    starts[bounds] = bounds
    positions = torch.arange(total, device=cu_seqlens.device) - torch.cummax(starts, 0).values
    return positions.view(batch, seq_len)


def split_text(text: str, max_chars: int) -> list[str]:
    """Cut a giant document into pieces of at most ``max_chars``, preferring whitespace cut points."""
    pieces, start = [], 0
    while len(text) - start > max_chars:
        end = start + max_chars
        cut = text.rfind(" ", start + max_chars // 2, end)
        end = cut + 1 if cut > 0 else end
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces
