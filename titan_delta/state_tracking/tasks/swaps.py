"""Element-swap tracking (DeltaFormer paper §4.1): follow n elements through a stream of swaps.

Elements 0..n-1 start at positions 0..n-1. Each input token names one unordered pair of positions
{i, j} (i < j), n(n-1)/2 tokens in all, and swaps the elements there. After every swap the target is
the element now at position 0 (the paper's "position 1"). ``length`` = number of swaps.
"""

from __future__ import annotations

import itertools

import numpy as np

from titan_delta.state_tracking.tasks.base import StateTrackingTask, require_positive


class ElementSwapTask(StateTrackingTask):
    name = "swaps"
    length_unit = "swaps"

    def __init__(self, num_elements: int = 5) -> None:
        self.num_elements = require_positive(self.name, "num_elements", num_elements, minimum=2)
        self.pairs = np.array(list(itertools.combinations(range(self.num_elements), 2)), dtype=np.int64)

    @property
    def vocab_size(self) -> int:
        return max(len(self.pairs), self.num_elements)

    def tokens_per_sequence(self, length: int) -> int:
        return length

    def generate(
        self, length: int, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        swaps = rng.integers(0, len(self.pairs), size=(batch_size, length))
        arrangement = np.tile(np.arange(self.num_elements), (batch_size, 1))  # [B, position] -> element
        rows = np.arange(batch_size)
        targets = np.empty((batch_size, length), dtype=np.int64)
        for t in range(length):
            i, j = self.pairs[swaps[:, t], 0], self.pairs[swaps[:, t], 1]
            at_i = arrangement[rows, i].copy()
            arrangement[rows, i] = arrangement[rows, j]
            arrangement[rows, j] = at_i
            targets[:, t] = arrangement[:, 0]
        return swaps, targets
