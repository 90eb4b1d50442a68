"""One pass over the configured sources into memory-mapped token shards (``tools/pretokenize.py``)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from titan_delta.data.config import DataConfig
from titan_delta.data.mixture import DocumentStream
from titan_delta.data.packing import split_text
from titan_delta.data.pretokenized import ShardWriter
from titan_delta.data.sources import Record, parse_source
from titan_delta.data.tokenizer import DataTokenizer


class Progress:
    """A one-line progress report on stderr (rewritten at most a few times a second)."""

    def __init__(self, total_tokens: int | None, stream=sys.stderr, every_s: float = 0.5) -> None:
        self.total, self.stream, self.every_s = total_tokens, stream, every_s
        self.start = self.last = time.perf_counter()

    def update(self, counts: Counter, final: bool = False) -> None:
        now = time.perf_counter()
        if not final and now - self.last < self.every_s:
            return
        self.last = now
        rate = counts["tokens"] / max(now - self.start, 1e-9)
        bar = ""
        if self.total:
            done = min(counts["tokens"] / self.total, 1.0)
            bar = f"[{'#' * int(30 * done):<30}] {100 * done:5.1f}% "
        skipped = counts["bad_records"] + counts["empty_documents"]
        self.stream.write(f"\r{bar}{counts['documents']:,} docs, {counts['tokens']:,} tokens, "
                          f"{rate / 1e6:.2f} M tok/s, skipped {skipped}, split {counts['split_documents']}")
        if final:
            self.stream.write("\n")
        self.stream.flush()


def _batches(docs: Iterator[tuple[int, Record]], size: int, counts: Counter) -> Iterator[list[str]]:
    batch: list[str] = []
    for _, record in docs:
        text = record()
        counts["documents"] += 1
        if text is None:
            counts["bad_records"] += 1
        elif not text.strip():
            counts["empty_documents"] += 1
        else:
            batch.append(text)
            if len(batch) == size:
                yield batch
                batch = []
    if batch:
        yield batch


def pretokenize(config: DataConfig, tokenizer: DataTokenizer, out: Path, max_tokens: int | None = None,
                shard_tokens: int = 1 << 28, progress: bool = True) -> Counter:
    """Tokenise one epoch of ``config.sources`` (mixed as the loader would) into shards under ``out``."""
    config.validate()
    sources = [parse_source(s, config.text_field, config.hub_retries, config.hub_backoff_s)
               for s in config.sources]
    stream = DocumentStream(sources, config.weights, config.seed, infinite=False)
    writer = ShardWriter(out, tokenizer.get_vocab_size(), tokenizer.fingerprint(), tokenizer.source,
                         shard_tokens)
    counts: Counter = Counter()
    bar = Progress(max_tokens) if progress else None
    bos = [tokenizer.bos_id] if config.add_bos and tokenizer.bos_id is not None else []
    for texts in _batches(stream.iterate(0), config.encode_batch_docs * 4, counts):
        for text in texts:
            if len(text) > config.max_doc_chars:
                counts["split_documents"] += 1
        pieces = [split_text(t, config.max_doc_chars) for t in texts]
        flat = tokenizer.encode_ordinary_batch([p for parts in pieces for p in parts])
        k = 0
        for parts in pieces:
            tokens = np.concatenate([np.asarray(bos, dtype=np.int64), *flat[k : k + len(parts)],
                                     np.asarray([tokenizer.eos_id], dtype=np.int64)])
            k += len(parts)
            writer.add(tokens)
            counts["tokens"] += len(tokens)
        if bar:
            bar.update(counts)
        if max_tokens is not None and counts["tokens"] >= max_tokens:
            break
    writer.close()
    if bar:
        bar.update(counts, final=True)
    return counts
