"""Masked per-position classification: loss and accuracies over the positions that carry a target."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from titan_delta.state_tracking.tasks.base import IGNORE_INDEX


def masked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over target positions; logits [B, T, C], targets [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)


@dataclass
class AccuracyCounts:
    """Running sums, so accuracy over many batches is exact (not a mean of batch means)."""

    correct_tokens: int = 0
    target_tokens: int = 0
    correct_sequences: int = 0
    sequences: int = 0
    majority_tokens: int = 0  # tokens a constant guess of each batch's most common target gets right

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        mask = targets != IGNORE_INDEX
        hits = (logits.argmax(dim=-1) == targets) & mask
        self.correct_tokens += int(hits.sum())
        self.target_tokens += int(mask.sum())
        self.correct_sequences += int((hits | ~mask).all(dim=1).sum())
        self.sequences += targets.shape[0]
        valid = targets[mask]
        if valid.numel():
            self.majority_tokens += int(torch.bincount(valid).max())

    @property
    def token_accuracy(self) -> float:
        return self.correct_tokens / max(self.target_tokens, 1)

    @property
    def sequence_accuracy(self) -> float:
        return self.correct_sequences / max(self.sequences, 1)

    @property
    def majority_baseline(self) -> float:
        return self.majority_tokens / max(self.target_tokens, 1)
