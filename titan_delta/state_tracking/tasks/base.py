"""The task interface: a seeded generator of (inputs, per-position targets) at a given problem size.

Every task maps a *length* (its problem size: swaps, group elements, bits, nodes, key-value pairs) to
token sequences. Input tokens and output classes share one id space of ``vocab_size`` ids, so a language
model with that vocabulary classifies each position over its logits; positions without a target hold
``IGNORE_INDEX`` and are left out of the loss and of the accuracy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

IGNORE_INDEX = -100


@dataclass(frozen=True)
class TaskBatch:
    inputs: torch.Tensor  # [B, T] int64 token ids
    targets: torch.Tensor  # [B, T] int64 class ids, IGNORE_INDEX where a position has no target

    def to(self, device: torch.device | str) -> TaskBatch:
        return TaskBatch(self.inputs.to(device), self.targets.to(device))


class StateTrackingTask(ABC):
    """A family of sequence problems; subclasses implement ``generate`` with numpy (fast, seedable)."""

    name: ClassVar[str]
    length_unit: ClassVar[str]  # what `length` counts, for tables and docs

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Ids used by inputs and targets together."""

    @abstractmethod
    def tokens_per_sequence(self, length: int) -> int:
        """Sequence length in tokens for a problem of size ``length``."""

    @abstractmethod
    def generate(
        self, length: int, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), both int64 [batch_size, tokens_per_sequence(length)]."""

    def check_length(self, length: int) -> None:
        """Raise a ValueError when the task cannot build a problem of this size."""
        if length < 1:
            raise ValueError(f"task {self.name}: length ({self.length_unit}) must be >= 1, got {length}")

    def sample(self, length: int, batch_size: int, rng: np.random.Generator) -> TaskBatch:
        self.check_length(length)
        if batch_size < 1:
            raise ValueError(f"task {self.name}: batch_size must be >= 1, got {batch_size}")
        inputs, targets = self.generate(length, batch_size, rng)
        return TaskBatch(
            torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(targets.astype(np.int64))
        )


def require_positive(task: str, field: str, value: int, minimum: int = 1) -> int:
    """Validate an integer task option; the error names the task and the field."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"task {task}: {field} must be an integer >= {minimum}, got {value!r}")
    return int(value)
