"""Hugging Face hub streaming (``hf:`` sources) with bounded retries that resume at the failed record.

``hf:HuggingFaceFW/fineweb-edu?name=sample-10BT&split=train`` streams a hub dataset;
``hf:parquet?data_files=URL1|URL2`` streams parquet files through ``datasets``' parquet builder (the
tests use this with a loopback HTTP server, through exactly the same code path).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from titan_delta.data.config import DataConfigError

logger = logging.getLogger(__name__)
HUB_OPTIONS = ("name", "split", "data_files", "revision")


class DataSourceError(RuntimeError):
    """A source failed for good (e.g. network lost past the retry budget); says where it stopped."""


class HubSource:
    def __init__(self, path: str, options: dict[str, str], field: str, retries: int = 5,
                 backoff_s: float = 2.0) -> None:
        unknown = set(options) - set(HUB_OPTIONS)
        if unknown:
            raise DataConfigError(f"[data] sources: hf:{path}: unknown options {sorted(unknown)}; "
                                  f"known: {', '.join(HUB_OPTIONS)}, field")
        if not path:
            raise DataConfigError("[data] sources: hf: needs a dataset name: hf:OWNER/NAME?name=CONFIG")
        self.path, self.options, self.field = path, options, field
        self.retries, self.backoff_s = retries, backoff_s
        self._dataset: Any = None
        self._loaded_once = False
        self._epoch_len: int | None = None

    @property
    def name(self) -> str:
        config = self.options.get("name")
        return f"hf:{self.path}" + (f" (config {config})" if config else "")

    def num_records(self) -> int | None:
        return self._epoch_len  # unknown until one full pass

    def _load(self) -> Any:
        if self._dataset is None:
            try:
                import datasets
            except ImportError as err:
                raise DataConfigError(f"{self.name}: hub streaming needs the 'datasets' package") from err
            kwargs: dict[str, Any] = {"split": self.options.get("split", "train"), "streaming": True}
            if "name" in self.options:
                kwargs["name"] = self.options["name"]
            if "revision" in self.options:
                kwargs["revision"] = self.options["revision"]
            if "data_files" in self.options:
                kwargs["data_files"] = {kwargs["split"]: self.options["data_files"].split("|")}
            try:
                self._dataset = datasets.load_dataset(self.path, **kwargs)
            except (datasets.exceptions.DatasetNotFoundError, FileNotFoundError, ValueError) as err:
                if self._loaded_once:
                    raise  # it existed a moment ago: a network failure, retried by the caller
                raise DataConfigError(f"{self.name}: dataset, config or split not found ({err})") from err
            self._loaded_once = True
        return self._dataset

    def iterate(self, start: int, infinite: bool) -> Iterator[Callable[[], str | None]]:
        """Records from ``start`` on; a failure retries (backoff) from the record that failed."""
        position = start
        failures = 0
        while True:
            epoch_pos = position % self._epoch_len if self._epoch_len else position
            try:
                dataset = self._load()
                emitted = 0
                for record in (dataset.skip(epoch_pos) if epoch_pos else dataset):
                    value = record.get(self.field) if isinstance(record, dict) else None
                    yield partial(_text, value if isinstance(value, str) else None)
                    position += 1
                    emitted += 1
                    failures = 0
                if self._epoch_len is None and emitted > 0:
                    self._epoch_len = epoch_pos + emitted
                elif self._epoch_len is None and epoch_pos > 0 and infinite:
                    # Resumed past the end of an epoch whose length was not known yet: count it once.
                    self._epoch_len = sum(1 for _ in dataset)
                    if self._epoch_len:
                        continue
            except DataConfigError:
                raise
            except Exception as err:
                failures += 1
                if failures > self.retries:
                    raise DataSourceError(
                        f"{self.name}: giving up after {self.retries} retries; stopped at record index "
                        f"{position} ({type(err).__name__}: {err})"
                    ) from err
                delay = self.backoff_s * 2 ** (failures - 1)
                logger.warning("%s: %s at record %d; retry %d/%d in %.1fs", self.name, type(err).__name__,
                               position, failures, self.retries, delay)
                self._dataset = None
                time.sleep(delay)
                continue
            if not infinite:
                return
            if not self._epoch_len:
                raise DataSourceError(f"{self.name}: the stream holds no records")


def _text(value: str | None) -> str | None:
    return value
