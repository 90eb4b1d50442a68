"""Memory-mapped token shards (written by ``tools/pretokenize.py``) and the loader's fast path over them.

Layout of a folder: ``index.json`` (dtype, tokenizer fingerprint, shard list), ``tokens_NNNNN.bin`` (raw
uint16/uint32 tokens, documents as ``[BOS] text EOS`` back to back) and ``docs_NNNNN.npy`` (int64 offsets of
document starts within the shard). Row ``g`` is tokens ``[g·T, g·T + T]`` of the concatenation, so the
cursor is one global row index: rank ``r`` of ``W`` reads rows ``G + r + W·k``, worker ``w`` of ``K``
builds the rank's batches ``w, w+K, ...``, and the batch order never depends on ``W`` or ``K``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from titan_delta.data.config import DataConfigError
from titan_delta.data.packing import collate_rows

INDEX = "index.json"


class ShardWriter:
    """Appends tokenised documents to fixed-size shards; ``close()`` writes the index."""

    def __init__(self, folder: Path, vocab_size: int, fingerprint: str, tokenizer_name: str,
                 shard_tokens: int = 1 << 28) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
        self.meta = {"format": 1, "dtype": np.dtype(self.dtype).name, "vocab_size": vocab_size,
                     "tokenizer": tokenizer_name, "fingerprint": fingerprint, "shards": []}
        self.shard_tokens = shard_tokens
        self._file = None
        self._written = 0
        self._starts: list[int] = []

    def add(self, tokens: np.ndarray) -> None:
        if self._file is None:
            self._open()
        self._starts.append(self._written)
        self._file.write(np.asarray(tokens, dtype=self.dtype).tobytes())
        self._written += len(tokens)
        if self._written >= self.shard_tokens:
            self._finish_shard()

    def _open(self) -> None:
        name = f"tokens_{len(self.meta['shards']):05d}.bin"
        self._file = (self.folder / name).open("wb")

    def _finish_shard(self) -> None:
        if self._file is None:
            return
        self._file.close()
        number = len(self.meta["shards"])
        np.save(self.folder / f"docs_{number:05d}.npy", np.asarray(self._starts, dtype=np.int64))
        self.meta["shards"].append({"tokens": f"tokens_{number:05d}.bin", "docs": f"docs_{number:05d}.npy",
                                    "num_tokens": self._written, "num_docs": len(self._starts)})
        self._file, self._written, self._starts = None, 0, []

    def close(self) -> dict:
        self._finish_shard()
        (self.folder / INDEX).write_text(json.dumps(self.meta, indent=1) + "\n")
        return self.meta


class TokenShards:
    """Read-only view of a shard folder as one token array with document starts (global offsets)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        index = self.folder / INDEX
        if not index.is_file():
            raise DataConfigError(f"data.pretokenized: {index} not found (tools/pretokenize.py writes it)")
        self.meta = json.loads(index.read_text())
        if not self.meta["shards"]:
            raise DataConfigError(f"data.pretokenized: {index} lists no shards")
        self.tokens = [np.memmap(self.folder / s["tokens"], dtype=self.meta["dtype"], mode="r",
                                 shape=(s["num_tokens"],)) for s in self.meta["shards"]]
        self.offsets = np.cumsum([0] + [s["num_tokens"] for s in self.meta["shards"]])
        shards = zip(self.meta["shards"], self.offsets, strict=False)
        self.doc_starts = np.concatenate([np.load(self.folder / s["docs"]) + base for s, base in shards])

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the concatenation (may span shards)."""
        parts = []
        shard = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while start < stop:
            base = self.offsets[shard]
            end = min(stop, self.offsets[shard + 1])
            parts.append(self.tokens[shard][start - base : end - base])
            start, shard = end, shard + 1
        return np.concatenate(parts).astype(np.int64)


class PretokenizedDataset(IterableDataset):
    """Yields whole batches of rows ``next_row + rank + W·k``; ``next_row`` is the global cursor."""

    def __init__(self, folder: str | Path, seq_len: int, batch_size: int, masking: bool, infinite: bool,
                 dp_rank: int = 0, dp_world_size: int = 1, fingerprint: str | None = None) -> None:
        super().__init__()
        self.shards = TokenShards(folder)
        if fingerprint is not None and fingerprint != self.shards.meta["fingerprint"]:
            raise DataConfigError(
                f"data.pretokenized {folder}: written with tokenizer {self.shards.meta['tokenizer']} "
                f"(fingerprint {self.shards.meta['fingerprint']}), but data.tokenizer has fingerprint "
                f"{fingerprint}"
            )
        self.seq_len, self.batch_size, self.masking, self.infinite = seq_len, batch_size, masking, infinite
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.num_rows = (self.shards.num_tokens - 1) // seq_len
        if self.num_rows < dp_world_size * batch_size:
            raise DataConfigError(f"data.pretokenized {folder}: {self.shards.num_tokens} tokens are fewer "
                                  f"than one global batch of {dp_world_size}x{batch_size} rows of {seq_len}")
        self.next_row = 0

    def row(self, g: int) -> tuple[np.ndarray, list[int]]:
        g %= self.num_rows
        start = g * self.seq_len
        tokens = self.shards.read(start, start + self.seq_len + 1)
        lo, hi = np.searchsorted(self.shards.doc_starts, [start, start + self.seq_len + 1])
        return tokens, (self.shards.doc_starts[lo:hi] - start).tolist()

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        B, W = self.batch_size, self.dp_world_size
        batch = worker
        while True:
            rows = [self.next_row + self.dp_rank + W * (batch * B + j) for j in range(B)]
            if not self.infinite and rows[-1] - self.dp_rank + W - 1 >= self.num_rows:
                return  # only whole global batches, so every rank stops at the same step
            taken = [self.row(g) for g in rows]
            out = collate_rows([t for t, _ in taken], [s for _, s in taken], self.masking)
            out["_cursor"] = torch.tensor([batch], dtype=torch.long)
            yield out
            batch += num_workers
