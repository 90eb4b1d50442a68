"""The tokenizer interface every data path uses (tiktoken ranks or a Hugging Face tokenizer.json)."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np
from torchtitan.components.tokenizer import BaseTokenizer

from titan_delta.data.config import DataConfigError


class DataTokenizer(BaseTokenizer):
    """What the data pipeline, pre-tokenisation, the model's vocabulary and the eval adapter use.

    ``encode`` (ordinary text, BOS/EOS only when asked), ``decode``, ``get_vocab_size`` (every id is below
    it), ``eos_id``, ``bos_id`` (``None`` when the tokenizer has none), ``source`` (a name for messages and
    the pre-tokenised index), ``encode_ordinary_batch`` and ``fingerprint``.
    """

    source: str
    eos_id: int
    bos_id: int | None

    @abstractmethod
    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of ``text`` as ordinary text: special-token text inside it is never a special token."""

    @abstractmethod
    def encode_ordinary_batch(self, texts: list[str]) -> list[np.ndarray]:
        """``encode_ordinary`` of each text, as int64 arrays."""

    @abstractmethod
    def fingerprint(self) -> str:
        """Identifies the exact vocabulary, so pre-tokenised shards are never read with another one."""

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False, **_: Any) -> list[int]:
        ids = self.encode_ordinary(text)
        if add_bos:
            if self.bos_id is None:
                raise DataConfigError(f"tokenizer {self.source} has no BOS token (set data.add_bos = false)")
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids
