"""Shared helpers of the data tests: small random corpora on disk, loaders, reference streams."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from titan_delta.data import DataConfig, TitanDataLoader, build_dataloader

WORDS = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
    "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega", "river",
    "stone", "light", "garden", "engine", "python", "tensor", "kernel", "memory",
]


def random_docs(n: int, min_words: int = 3, max_words: int = 60) -> list[str]:
    """Fresh random documents (seeded per test by the root conftest) with a unique marker each."""
    docs = []
    for i in range(n):
        length = int(torch.randint(min_words, max_words + 1, ()).item())
        picks = torch.randint(0, len(WORDS), (length,)).tolist()
        docs.append(f"doc{i}: " + " ".join(WORDS[p] for p in picks) + ".")
    return docs


def write_parquet(path: Path, docs: list[str], row_group_size: int = 16) -> Path:
    table = pa.table({"text": docs, "id": [f"id{i}" for i in range(len(docs))]})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d}) + "\n" for d in docs))
    return path


def make_loader(data: DataConfig, seq_len: int, batch: int, rank: int = 0, world: int = 1,
                infinite: bool = True, tokenizer=None) -> TitanDataLoader:
    job = SimpleNamespace(data=data, training=SimpleNamespace(seq_len=seq_len, local_batch_size=batch))
    return build_dataloader(world, rank, tokenizer, job, infinite=infinite)


def take(loader, n: int | None) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    out = []
    for batch in loader:
        out.append(batch)
        if n is not None and len(out) == n:
            break
    return out


IGNORE = -100


def reference_stream(tokenizer, docs: list[str], add_bos: bool) -> tuple[np.ndarray, set[int]]:
    """Documents as [BOS] text EOS back to back, and the stream positions where documents start."""
    tokens, starts = [], set()
    for doc in docs:
        starts.add(len(tokens))
        tokens += ([tokenizer.bos_id] if add_bos else []) + tokenizer.encode(doc) + [tokenizer.eos_id]
    return np.asarray(tokens), starts


def rows_of(batches) -> Counter:
    """Multiset of (input row, label row): equal multisets mean no row lost and none repeated."""
    rows: Counter = Counter()
    for inputs, labels in batches:
        for x, y in zip(inputs["input"].tolist(), labels.tolist(), strict=True):
            rows[(tuple(x), tuple(y))] += 1
    return rows


def assert_same_batches(a, b) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert xa.keys() == xb.keys()
        for key in xa:
            assert torch.equal(xa[key], xb[key]), key
        assert torch.equal(ya, yb)
