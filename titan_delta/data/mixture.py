"""A weighted mixture of sources as one deterministic document stream addressed by a global index.

Document ``i`` comes from the source picked by a counter-based hash of ``(seed, i)``, so the stream can
be reopened at any index without replaying it: a source's cursor is the number of picks before ``i``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from titan_delta.data.sources import Record, Source

_CHUNK = 1 << 16


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def mixture_choices(seed: int, weights: Sequence[float], start: int, count: int) -> np.ndarray:
    """Source index of documents ``start .. start+count-1`` (int64), drawn with probability ∝ weight."""
    if len(weights) == 1:
        return np.zeros(count, dtype=np.int64)
    index = np.arange(start, start + count, dtype=np.uint64)
    key = _splitmix64(np.array([seed & (2**64 - 1)], dtype=np.uint64))
    uniform = (_splitmix64(index ^ key) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64))
    cumulative /= cumulative[-1]
    return np.minimum(np.searchsorted(cumulative, uniform, side="right"), len(weights) - 1).astype(np.int64)


class DocumentStream:
    """Documents ``(i, record)`` from global index ``start``; ``record()`` gives the text or None.

    Ends when a picked source runs out (only when not ``infinite``: infinite sources wrap into their next
    epoch)."""

    def __init__(
        self, sources: Sequence[Source], weights: Sequence[float], seed: int, infinite: bool
    ) -> None:
        self.sources = list(sources)
        self.weights = list(weights) if weights else [1.0] * len(self.sources)
        self.seed, self.infinite = seed, infinite

    def source_cursors(self, start: int) -> list[int]:
        """How many documents each source has given before global document ``start``."""
        counts = np.zeros(len(self.sources), dtype=np.int64)
        for offset in range(0, start, _CHUNK):
            picks = mixture_choices(self.seed, self.weights, offset, min(_CHUNK, start - offset))
            counts += np.bincount(picks, minlength=len(self.sources))
        return counts.tolist()

    def iterate(self, start: int) -> Iterator[tuple[int, Record]]:
        cursors = self.source_cursors(start)
        iterators: list[Iterator[Record] | None] = [None] * len(self.sources)
        index = start
        while True:
            picks = mixture_choices(self.seed, self.weights, index, _CHUNK if len(self.sources) > 1 else 1024)
            for pick in picks.tolist():
                it = iterators[pick]
                if it is None:
                    it = iterators[pick] = self.sources[pick].iterate(cursors[pick], self.infinite)
                try:
                    record = next(it)
                except StopIteration:
                    return
                yield index, record
                index += 1
