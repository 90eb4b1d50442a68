"""Multi-query associative recall (MQAR, Zoology): recall the value bound to each queried key.

Sequence: ``length`` key-value pairs ``k1 v1 … kN vN`` (distinct keys from a pool of ``num_keys``,
values uniform from ``num_values``), then queries — keys of the context in random order, each asked at
most once. The target on a query token is the value that was bound to it. Keys use ids 0..num_keys-1
and values num_keys..num_keys+num_values-1 (targets are value ids). ``length`` = number of pairs.
"""

from __future__ import annotations

import numpy as np

from titan_delta.state_tracking.tasks.base import IGNORE_INDEX, StateTrackingTask, require_positive


class MultiQueryRecallTask(StateTrackingTask):
    name = "mqar"
    length_unit = "pairs"

    def __init__(self, num_keys: int = 64, num_values: int = 64, num_queries: int | None = None) -> None:
        self.num_keys = require_positive(self.name, "num_keys", num_keys)
        self.num_values = require_positive(self.name, "num_values", num_values)
        self.num_queries = (
            None if num_queries is None else require_positive(self.name, "num_queries", num_queries)
        )

    @property
    def vocab_size(self) -> int:
        return self.num_keys + self.num_values

    def queries(self, length: int) -> int:
        """Queries per sequence: ``num_queries`` capped at the number of pairs (all pairs when unset)."""
        return length if self.num_queries is None else min(self.num_queries, length)

    def tokens_per_sequence(self, length: int) -> int:
        return 2 * length + self.queries(length)

    def check_length(self, length: int) -> None:
        super().check_length(length)
        if length > self.num_keys:
            raise ValueError(
                f"task {self.name}: {length} pairs need distinct keys but num_keys={self.num_keys}; "
                "raise task.num_keys"
            )

    def generate(
        self, length: int, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        B, n, m = batch_size, length, self.queries(length)
        keys = np.argsort(rng.random((B, self.num_keys)), axis=1)[:, :n]
        values = self.num_keys + rng.integers(0, self.num_values, size=(B, n))
        asked = np.argsort(rng.random((B, n)), axis=1)[:, :m]  # which pairs are queried, in query order
        inputs = np.empty((B, 2 * n + m), dtype=np.int64)
        targets = np.full_like(inputs, IGNORE_INDEX)
        inputs[:, 0 : 2 * n : 2] = keys
        inputs[:, 1 : 2 * n : 2] = values
        inputs[:, 2 * n :] = np.take_along_axis(keys, asked, axis=1)
        targets[:, 2 * n :] = np.take_along_axis(values, asked, axis=1)
        return inputs, targets
