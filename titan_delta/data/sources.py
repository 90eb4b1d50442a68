"""Document sources addressed by record index, so a cursor can reopen any of them at any record.

``iterate(start)`` yields records ``start, start+1, ...`` (wrapping into later epochs when ``infinite``)
as zero-argument callables that return the text: a loader worker materialises (decodes, parses) only the
documents of its own lanes, which keeps reading the shared stream cheap at large world sizes. A record that
cannot be used (missing or non-string field, non-UTF-8 bytes, bad JSON) returns ``None`` so it still
occupies its index: skipping never shifts any later record.
"""

from __future__ import annotations

import glob
import gzip
import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from urllib.parse import parse_qsl

import pyarrow as pa
import pyarrow.parquet as pq

from titan_delta.data.config import DataConfigError
from titan_delta.data.hub import HubSource

DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "assets" / "default_corpus.parquet"
Record = Callable[[], "str | None"]
EXTENSIONS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".gz": "jsonl", ".txt": "txt"}


class LocalSource:
    """Files matched by a glob, read in sorted order; ``kind`` is parquet, jsonl (or .jsonl.gz) or txt."""

    def __init__(self, kind: str, pattern: str, field: str) -> None:
        self.kind, self.pattern, self.field = kind, pattern, field
        self.files = sorted(Path(p) for p in glob.glob(str(Path(pattern).expanduser()), recursive=True))
        if not self.files:
            what = f"no file matches (expected {kind} files)" if glob.has_magic(pattern) else "file not found"
            raise DataConfigError(f"[data] sources: {pattern}: {what}")
        self._counts: list[int] | None = None

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.pattern}"

    def _file_counts(self) -> list[int]:
        if self._counts is None:
            if self.kind == "parquet":
                self._counts = [self._parquet(f).metadata.num_rows for f in self.files]
            elif self.kind == "jsonl":
                self._counts = [sum(1 for _ in self._open(f)) for f in self.files]
            else:
                self._counts = [1] * len(self.files)
        return self._counts

    def num_records(self) -> int:
        return sum(self._file_counts())

    def iterate(self, start: int, infinite: bool) -> Iterator[Record]:
        position = start
        if infinite and position > 0:  # jsonl files are only counted (one scan) when a resume needs it
            total = self.num_records()
            position = position % total if total else 0
        while True:
            emitted = 0
            for record in self._one_epoch(position):
                emitted += 1
                yield record
            if not infinite:
                return
            if emitted == 0 and position == 0:
                raise DataConfigError(f"[data] sources: {self.name}: holds no records")
            position = 0

    def _one_epoch(self, start: int) -> Iterator[Record]:
        """Records from ``start`` to the end of the files; jsonl skips lines instead of counting them."""
        if self.kind == "txt":
            yield from (partial(_file_text, path) for path in self.files[start:])
            return
        if self.kind == "jsonl":
            index = 0
            for path in self.files:
                for line in self._open(path):
                    if index >= start:
                        yield partial(_json_text, line, self.field)
                    index += 1
            return
        for path, count in zip(self.files, self._file_counts(), strict=True):
            if start >= count:
                start -= count
                continue
            yield from self._parquet_records(path, start)
            start = 0

    def _parquet(self, path: Path) -> pq.ParquetFile:
        try:
            return pq.ParquetFile(path)
        except (OSError, pa.ArrowInvalid) as err:
            raise DataConfigError(f"[data] sources: {path}: cannot read it as parquet ({err})") from err

    def _parquet_records(self, path: Path, start: int) -> Iterator[Record]:
        pf = self._parquet(path)
        if self.field not in pf.schema_arrow.names:
            # Every row lacks the field: each is a skipped record (counted), not a crash.
            yield from [_missing] * (pf.metadata.num_rows - start)
            return
        for group in range(pf.metadata.num_row_groups):
            rows = pf.metadata.row_group(group).num_rows
            if start >= rows:
                start -= rows
                continue
            column = pf.read_row_group(group, columns=[self.field]).column(0).combine_chunks()
            if any(t(column.type) for t in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                            pa.types.is_large_binary)):
                yield from (partial(_arrow_text, column, k) for k in range(start, rows))
            else:
                yield from [_missing] * (rows - start)
            start = 0

    @staticmethod
    def _open(path: Path):
        return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def _missing() -> None:
    return None


def _arrow_text(column: pa.Array, k: int) -> str | None:
    value = column[k].as_py()
    return _utf8(value) if isinstance(value, bytes) else value


def _file_text(path: Path) -> str | None:
    return _utf8(path.read_bytes())


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _json_text(line: bytes, field: str) -> str | None:
    text = _utf8(line)
    if text is None:
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return None
    value = record.get(field) if isinstance(record, dict) else None
    return value if isinstance(value, str) else None


Source = LocalSource | HubSource


def parse_source(spec: str, default_field: str, retries: int = 5, backoff_s: float = 2.0) -> Source:
    """Turn one ``data.sources`` entry into a source (see :class:`titan_delta.data.config.DataConfig`)."""
    body, _, query = spec.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    field = options.pop("field", default_field)
    if body == "default":
        return LocalSource("parquet", str(DEFAULT_CORPUS), field)
    kind, sep, rest = body.partition(":")
    if sep and kind == "hf":
        return HubSource(rest, options, field, retries=retries, backoff_s=backoff_s)
    if options:
        raise DataConfigError(f"[data] sources: {spec!r}: unknown options {sorted(options)} (only 'field')")
    if sep and kind in ("parquet", "jsonl", "txt"):
        return LocalSource(kind, rest, field)
    suffix = Path(body).suffix
    if suffix in EXTENSIONS:
        return LocalSource(EXTENSIONS[suffix], body, field)
    raise DataConfigError(
        f"[data] sources: {spec!r}: expected 'default', 'hf:OWNER/NAME?...', 'parquet:GLOB', 'jsonl:GLOB', "
        "'txt:GLOB' or a glob ending in .parquet/.jsonl/.jsonl.gz/.txt"
    )
