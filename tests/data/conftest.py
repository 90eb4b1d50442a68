"""Shared fixtures for the data tests: the shipped tokenizer and small random corpora on disk."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from titan_delta.data import DataConfig, TitanDataLoader, build_dataloader, load_tokenizer

# torchdata calls a deprecated torch API on every loader start; it is noise here.
warnings.filterwarnings("ignore", message=".*set_vital.*")

WORDS = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
    "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega", "river",
    "stone", "light", "garden", "engine", "python", "tensor", "kernel", "memory",
]


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("default", threads=2)


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
