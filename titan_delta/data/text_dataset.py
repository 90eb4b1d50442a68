"""Tokenise-and-pack from raw text, resumable at any world size through per-lane cursors.

The global document stream is dealt to ``lanes`` independent packing streams (document ``i`` goes to
lane ``i mod lanes``). Rank ``r`` of ``W`` owns lanes ``r, r+W, ...`` and its loader worker ``w`` of ``K``
owns every ``K``-th of those, so no document is tokenised twice. A lane's cursor is ``(document, token
offset)`` of its next row; the saved state is one cursor per lane and does not mention ``W`` or ``K``, so
a run can resume on another number of ranks or workers and still see every token exactly once.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from titan_delta.data.config import DataConfigError
from titan_delta.data.mixture import DocumentStream
from titan_delta.data.packing import collate_rows, split_text
from titan_delta.data.sources import Record
from titan_delta.data.tokenizer import DataTokenizer

logger = logging.getLogger(__name__)
UNUSABLE_LIMIT = 10_000  # consecutive unusable documents that mean a misconfiguration, not bad records


@dataclass
class PackingOptions:
    seq_len: int
    batch_size: int
    lanes: int
    masking: bool = False
    add_bos: bool = False
    encode_batch_docs: int = 64
    max_doc_chars: int = 1_000_000


class _Lane:
    """One packing stream: queued tokenised documents and the cursor of its next row."""

    def __init__(self, doc: int, offset: int, rows: int) -> None:
        self.docs: deque[tuple[int, np.ndarray]] = deque()
        self.doc, self.offset = doc, offset  # cursor; docs[0] is that document once it is loaded
        self.rows = rows  # rows emitted so far: restores the round-robin position on resume

    def take_row(self, length: int) -> tuple[np.ndarray, list[int]] | None:
        """``length`` tokens from the cursor plus the row positions where documents start; the cursor then
        moves to the row's last token (shared with the next row). None if the queue is short."""
        have = sum(len(t) for _, t in self.docs) - self.offset
        if have < length:
            return None
        pieces, starts, filled = [], [], 0
        while filled < length:
            tokens = self.docs[0][1]
            if self.offset == 0:
                starts.append(filled)
            piece = tokens[self.offset : self.offset + length - filled]
            pieces.append(piece)
            filled += len(piece)
            self.offset += len(piece)
            if self.offset == len(tokens) and filled < length:
                self.docs.popleft()
                self.offset = 0
        self.offset -= 1
        self.doc = self.docs[0][0]
        self.rows += 1
        return np.concatenate(pieces), starts


class PackedTextDataset(IterableDataset):
    """Yields whole batches (``batch_size=None`` in the loader) with a ``_cursor`` tensor of lane states."""

    def __init__(self, stream: DocumentStream, tokenizer: DataTokenizer, options: PackingOptions,
                 dp_rank: int = 0, dp_world_size: int = 1) -> None:
        super().__init__()
        self.stream, self.tokenizer, self.options = stream, tokenizer, options
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.cursors: dict[int, tuple[int, int, int]] = {v: (v, 0, 0) for v in self.rank_lanes()}
        self.stats: Counter[str] = Counter()
        self._next_log = 1000
        self._unusable_run = 0

    def rank_lanes(self) -> list[int]:
        return list(range(self.dp_rank, self.options.lanes, self.dp_world_size))

    def worker_lanes(self, worker: int, num_workers: int) -> list[int]:
        lanes = self.rank_lanes()[worker::num_workers]
        if not lanes:
            raise ValueError(
                f"data.lanes={self.options.lanes} is too small for dp_world_size={self.dp_world_size} x "
                f"num_workers={num_workers}: every loader worker needs at least one lane"
            )
        return lanes

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        opts = self.options
        # The loader takes batches from workers 0, 1, ... in turn; after n batches the next one belongs to
        # worker n mod K of the uninterrupted run, so shift the lane split to match it.
        batches_done = sum(rows for _, _, rows in self.cursors.values()) // opts.batch_size
        worker = (worker + batches_done) % num_workers
        lanes = {v: _Lane(*self.cursors[v]) for v in self.worker_lanes(worker, num_workers)}
        docs = self.stream.iterate(min(lane.doc for lane in lanes.values()))
        active = list(lanes)
        # Round-robin resumes at the first lane that has emitted fewer rows than the one before it.
        fewest = min(lanes[v].rows for v in active)
        turn = next(i for i, v in enumerate(active) if lanes[v].rows == fewest)
        active = active[turn:] + active[:turn]
        rows: list[np.ndarray] = []
        starts: list[list[int]] = []
        cursor: list[tuple[int, int, int, int]] = []
        while active:
            for v in list(active):
                lane = lanes[v]
                taken = lane.take_row(opts.seq_len + 1)
                while taken is None and self._refill(docs, lanes):
                    taken = lane.take_row(opts.seq_len + 1)
                if taken is None:  # finite stream ended: the lane's tail shorter than a row is dropped
                    active.remove(v)
                    continue
                rows.append(taken[0])
                starts.append(taken[1])
                cursor.append((v, lane.doc, lane.offset, lane.rows))
                if len(rows) == opts.batch_size:
                    batch = collate_rows(rows, starts, opts.masking)
                    batch["_cursor"] = torch.tensor(cursor, dtype=torch.long)
                    yield batch
                    rows, starts, cursor = [], [], []
        self._log_stats(final=True)

    def _refill(self, docs: Iterator[tuple[int, Record]], lanes: dict[int, _Lane]) -> bool:
        """Read global documents until ``encode_batch_docs`` of them belong to this worker; tokenise them
        together. False once the stream is exhausted and nothing was added."""
        opts = self.options
        kept: list[tuple[int, int, str]] = []
        for index, record in docs:
            lane = lanes.get(index % opts.lanes)
            if lane is None or index < lane.doc:
                continue
            text = record()
            self.stats["documents"] += 1
            if text is None or not text.strip():
                self.stats["bad_records" if text is None else "empty_documents"] += 1
                self._unusable_run += 1
                if self._unusable_run >= UNUSABLE_LIMIT:
                    names = ", ".join(f"{s.name} (field '{s.field}')" for s in self.stream.sources)
                    raise DataConfigError(
                        f"{UNUSABLE_LIMIT} documents in a row had no usable text (missing field, bad "
                        f"encoding or empty) in {names}: check data.text_field / ?field= and the files"
                    )
            else:
                self._unusable_run = 0
                kept.append((index % opts.lanes, index, text))
                if len(kept) >= opts.encode_batch_docs:
                    break
        if not kept:
            return False
        pieces: list[str] = []
        owners: list[int] = []
        for k, (_, _, text) in enumerate(kept):
            parts = split_text(text, opts.max_doc_chars) if len(text) > opts.max_doc_chars else [text]
            if len(parts) > 1:
                self.stats["split_documents"] += 1
            pieces += parts
            owners += [k] * len(parts)
        encoded = self.tokenizer.encode_ordinary_batch(pieces)
        per_doc: list[list[np.ndarray]] = [[] for _ in kept]
        for k, ids in zip(owners, encoded, strict=True):
            per_doc[k].append(ids)
        bos = [self.tokenizer.bos_id] if opts.add_bos and self.tokenizer.bos_id is not None else []
        for (v, index, _), parts in zip(kept, per_doc, strict=True):
            tokens = np.concatenate([np.asarray(bos, dtype=np.int64), *parts,
                                     np.asarray([self.tokenizer.eos_id], dtype=np.int64)])
            lanes[v].docs.append((index, tokens))
            self.stats["tokens"] += len(tokens)
        if self.stats["documents"] >= self._next_log:
            self._log_stats()
        return True

    def _log_stats(self, final: bool = False) -> None:
        skipped = {k: self.stats[k] for k in ("bad_records", "empty_documents", "split_documents")}
        if final or any(skipped.values()):
            logger.info("data rank %d: %d documents, %d tokens; skipped/split: %s", self.dp_rank,
                        self.stats["documents"], self.stats["tokens"], skipped)
        self._next_log = max(1000, 2 * self.stats["documents"])
