"""Running parity: inputs are bits, the target after each bit is the XOR of all bits so far.

The smallest state-tracking problem (the group Z2); ``length`` = number of bits.
"""

from __future__ import annotations

import numpy as np

from titan_delta.state_tracking.tasks.base import StateTrackingTask


class ParityTask(StateTrackingTask):
    name = "parity"
    length_unit = "bits"

    @property
    def vocab_size(self) -> int:
        return 2

    def tokens_per_sequence(self, length: int) -> int:
        return length

    def generate(
        self, length: int, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        bits = rng.integers(0, 2, size=(batch_size, length))
        return bits, np.cumsum(bits, axis=1) % 2
