"""Pre-tokenised shards: the writer, the memory-mapped loader, its global cursor and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.data.helpers import assert_same_batches, make_loader, random_docs, take, write_jsonl
from titan_delta.data import DataConfig, DataConfigError, load_tokenizer
from titan_delta.data.pretokenize import pretokenize
from titan_delta.data.pretokenized import TokenShards
from titan_delta.data.tokenizer import DEFAULT_TOKENIZER


@pytest.fixture
def shards(tmp_path, tokenizer):
    docs = random_docs(120, max_words=30)
    write_jsonl(tmp_path / "docs.jsonl", docs)
    config = DataConfig(sources=[f"jsonl:{tmp_path}/docs.jsonl"], encode_batch_docs=8)
    out = tmp_path / "shards"
    counts = pretokenize(config, tokenizer, out, shard_tokens=500, progress=False)  # several shards
    expected = [t for d in docs for t in [*tokenizer.encode(d), tokenizer.eos_id]]
    return out, np.asarray(expected), counts


def pretok_config(folder, workers=0) -> DataConfig:
    return DataConfig(pretokenized=str(folder), document_masking=True, num_workers=workers, prefetch_factor=2)


def test_shards_hold_the_token_stream(shards):
    folder, expected, counts = shards
    view = TokenShards(folder)
    meta = json.loads((folder / "index.json").read_text())
    assert len(meta["shards"]) > 3 and meta["dtype"] == "uint16"
    assert view.num_tokens == len(expected) == counts["tokens"]
    assert np.array_equal(view.read(0, view.num_tokens), expected)
    lo = int(torch.randint(0, view.num_tokens - 700, ()).item())
    assert np.array_equal(view.read(lo, lo + 700), expected[lo : lo + 700])  # spans shard boundaries
    assert len(view.doc_starts) == 120 and view.doc_starts[0] == 0


def test_rows_follow_the_global_order_at_any_world_size(shards, tokenizer):
    folder, expected, _ = shards
    seq_len, batch = 19, 2
    single = take(make_loader(pretok_config(folder), seq_len, batch, tokenizer=tokenizer), 12)
    stream_rows = [x for inputs, _ in single for x in inputs["input"]]
    for g, row in enumerate(stream_rows):
        assert torch.equal(row, torch.from_numpy(expected[g * seq_len : (g + 1) * seq_len]))
    # Two workers give the same batches in the same order (workers build batches w, w+K, ...).
    assert_same_batches(take(make_loader(pretok_config(folder, 2), seq_len, batch, tokenizer=tokenizer), 12),
                        single)
    # 2 ranks for 2 steps, then 3 ranks resume from the saved global cursor.
    old = [make_loader(pretok_config(folder), seq_len, batch, r, 2, tokenizer=tokenizer) for r in range(2)]
    seen = {}
    for r, loader in enumerate(old):
        for k, (inputs, _) in enumerate(take(loader, 2)):
            for j, row in enumerate(inputs["input"]):
                seen[r + 2 * (k * batch + j)] = row
    states = [loader.state_dict() for loader in old]
    assert all(torch.equal(s["next_row"], torch.tensor(8)) for s in states)
    for r in range(3):
        loader = make_loader(pretok_config(folder, 2), seq_len, batch, r, 3, tokenizer=tokenizer)
        loader.load_state_dict(states[0])
        for k, (inputs, _) in enumerate(take(loader, 1)):
            for j, row in enumerate(inputs["input"]):
                seen[8 + r + 3 * (k * batch + j)] = row
    assert sorted(seen) == list(range(14))
    for g, row in seen.items():
        assert torch.equal(row, stream_rows[g])


def test_exact_resume_pretokenized(shards, tokenizer):
    folder, _, _ = shards
    full = take(make_loader(pretok_config(folder, 2), 16, 3, tokenizer=tokenizer), 9)
    first = make_loader(pretok_config(folder, 2), 16, 3, tokenizer=tokenizer)
    take(first, 4)
    resumed = make_loader(pretok_config(folder), 16, 3, tokenizer=tokenizer)  # other worker count
    resumed.load_state_dict(first.state_dict())
    assert_same_batches(take(resumed, 5), full[4:])


def test_pretokenized_refuses_another_tokenizer(shards, tmp_path):
    folder, _, _ = shards
    other = tmp_path / "other.tiktoken"
    lines = DEFAULT_TOKENIZER.read_text().splitlines()[:5000]
    other.write_text("\n".join(lines) + "\n")
    small = load_tokenizer(str(other), pattern="cl100k")
    with pytest.raises(DataConfigError, match="fingerprint"):
        make_loader(pretok_config(folder), 16, 2, tokenizer=small)
    with pytest.raises(DataConfigError, match=r"index\.json not found"):
        make_loader(pretok_config(tmp_path / "nothing"), 16, 2, tokenizer=small)
