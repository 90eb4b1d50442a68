"""Local sources (parquet, jsonl, jsonl.gz, txt), bad records, clear errors, mixture proportions."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.data.helpers import make_loader, random_docs, take, write_jsonl, write_parquet
from titan_delta.data import DataConfig, DataConfigError
from titan_delta.data.mixture import DocumentStream, mixture_choices
from titan_delta.data.sources import parse_source


def read_all(spec: str, start: int = 0) -> list[str | None]:
    return [record() for record in parse_source(spec, "text").iterate(start, infinite=False)]


def test_local_formats_read_the_same_documents(tmp_path):
    docs = random_docs(23)
    write_parquet(tmp_path / "a.parquet", docs[:10], row_group_size=3)
    write_parquet(tmp_path / "b.parquet", docs[10:], row_group_size=4)
    write_jsonl(tmp_path / "a.jsonl", docs[:12])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs[12:])
    (tmp_path / "txt").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "txt" / f"{i:03d}.txt").write_text(d)
    assert read_all(f"parquet:{tmp_path}/*.parquet") == docs
    assert read_all(f"{tmp_path}/*.parquet") == docs  # type from the extension
    assert read_all(f"jsonl:{tmp_path}/*.jsonl*") == docs
    assert read_all(f"txt:{tmp_path}/txt/*.txt") == docs
    # Reopening at any record index (the resume path) gives the same suffix.
    for start in (0, 2, 3, 10, 17, 22, 23):
        assert read_all(f"parquet:{tmp_path}/*.parquet", start) == docs[start:]
        assert read_all(f"jsonl:{tmp_path}/*.jsonl*", start) == docs[start:]
    # Infinite mode wraps into the next epoch.
    it = parse_source(f"parquet:{tmp_path}/*.parquet", "text").iterate(21, infinite=True)
    assert [next(it)() for _ in range(4)] == docs[21:] + docs[:2]


def test_other_text_field(tmp_path):
    docs = random_docs(5)
    write_jsonl(tmp_path / "c.jsonl", docs, field="content")
    assert read_all(f"jsonl:{tmp_path}/c.jsonl?field=content") == docs
    assert read_all(f"jsonl:{tmp_path}/c.jsonl") == [None] * 5  # no 'text' field: every record skipped


def test_bad_records_are_skipped_and_counted(tmp_path, tokenizer):
    good = random_docs(30)
    lines = [json.dumps({"text": d}).encode() for d in good]
    lines[3] = json.dumps({"title": "no text field"}).encode()
    lines[5] = b'{"text": "caf\xe9 latin-1 bytes"}'  # not UTF-8
    lines[7] = b"{not json"
    lines[9] = json.dumps({"text": "   \n "}).encode()  # empty
    lines[11] = json.dumps({"text": 12345}).encode()  # wrong type
    giant = " ".join(["giant"] * 3000)
    lines[13] = json.dumps({"text": giant}).encode()
    (tmp_path / "bad.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    pq.write_table(pa.table({"body": good[:4]}), tmp_path / "nofield.parquet")
    config = DataConfig(sources=[f"jsonl:{tmp_path}/bad.jsonl", f"parquet:{tmp_path}/nofield.parquet"],
                        weights=[0.8, 0.2], lanes=1, num_workers=0, max_doc_chars=1000)
    loader = make_loader(config, 16, 2, infinite=False, tokenizer=tokenizer)
    batches = take(loader, None)
    assert batches, "the good documents still produce batches"
    stats = loader.dataset.stats
    assert stats["bad_records"] >= 4 and stats["empty_documents"] == 1 and stats["split_documents"] == 1
    text = tokenizer.decode(np.concatenate([b[0]["input"].reshape(-1).numpy() for b in batches]))
    assert "giant giant" in text and "latin-1" not in text


def test_wrong_field_everywhere_is_an_error_not_a_hang(tmp_path, tokenizer, monkeypatch):
    import titan_delta.data.text_dataset as text_dataset

    monkeypatch.setattr(text_dataset, "UNUSABLE_LIMIT", 50)
    write_jsonl(tmp_path / "c.jsonl", random_docs(7), field="content")
    config = DataConfig(sources=[f"jsonl:{tmp_path}/c.jsonl"], lanes=1, num_workers=0)
    with pytest.raises(DataConfigError, match=r"jsonl:.*c\.jsonl \(field 'text'\)"):
        take(make_loader(config, 16, 2, infinite=True, tokenizer=tokenizer), 1)


def test_missing_files_and_unknown_sources_fail_clearly(tmp_path):
    with pytest.raises(DataConfigError, match=r"nowhere/\*\.parquet"):
        parse_source(f"parquet:{tmp_path}/nowhere/*.parquet", "text")
    with pytest.raises(DataConfigError, match="expected 'default'"):
        parse_source("csv:/data/x.csv", "text")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataConfigError, match=r"junk\.parquet"):
        read_all(f"parquet:{tmp_path}/junk.parquet")
    with pytest.raises(DataConfigError, match="weights has 1 entries"):
        DataConfig(sources=["default", "default"], weights=[1.0]).validate()


def test_mixture_choices_follow_weights():
    weights = [0.6, 0.3, 0.1, 0.0]
    seed = int(np.random.default_rng().integers(1 << 31))
    picks = mixture_choices(seed, weights, 0, 200_000)
    freq = np.bincount(picks, minlength=4) / len(picks)
    assert np.abs(freq - np.array(weights)).max() < 0.006, freq  # > 5 binomial standard deviations
    assert np.array_equal(mixture_choices(seed, weights, 1234, 100), picks[1234:1334])  # addressable
    assert not np.array_equal(mixture_choices(seed + 1, weights, 0, 1000), picks[:1000])


def test_mixture_stream_resumes_mid_way(tmp_path):
    a, b = random_docs(50), random_docs(50)
    write_jsonl(tmp_path / "a.jsonl", [f"A {d}" for d in a])
    write_jsonl(tmp_path / "b.jsonl", [f"B {d}" for d in b])
    sources = [parse_source(f"jsonl:{tmp_path}/{n}.jsonl", "text") for n in "ab"]
    stream = DocumentStream(sources, [3, 1], seed=7, infinite=True)
    full = [t() for _, (_, t) in zip(range(300), stream.iterate(0), strict=False)]
    share_a = sum(t.startswith("A") for t in full) / len(full)
    assert 0.6 < share_a < 0.9
    resumed = [t() for _, (_, t) in zip(range(100), stream.iterate(200), strict=False)]
    assert resumed == full[200:]
