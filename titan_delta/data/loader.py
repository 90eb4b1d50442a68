"""The training data loader: a torchdata ``StatefulDataLoader`` whose checkpoint state is a global cursor.

Workers build whole batches; the main process strips each batch's ``_cursor`` and keeps the position of
the last batch it handed to the trainer, so prefetched-but-unused batches are never counted. The state
(``state_dict``) holds tensors only and never depends on the data-parallel world size or worker count:
per-lane cursors for raw text, one global row index for pre-tokenised shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchtitan.components.dataloader import BaseDataLoader

from titan_delta.data.config import DataConfig, DataConfigError, data_config_from
from titan_delta.data.mixture import DocumentStream
from titan_delta.data.pretokenized import PretokenizedDataset
from titan_delta.data.sources import parse_source
from titan_delta.data.text_dataset import PackedTextDataset, PackingOptions
from titan_delta.data.tokenizer import DataTokenizer, build_tokenizer

TEXT, PRETOKENIZED = 1, 2
Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


class TitanDataLoader(StatefulDataLoader, BaseDataLoader):
    def __init__(self, dataset: PackedTextDataset | PretokenizedDataset, num_workers: int = 0,
                 prefetch_factor: int = 4, pin_memory: bool = False) -> None:
        extra = {"prefetch_factor": prefetch_factor, "persistent_workers": False} if num_workers else {}
        super().__init__(dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, **extra)
        self._consumed_rows = 0  # pre-tokenised: rows per rank handed out since the cursor was set

    def layout(self) -> torch.Tensor:
        ds = self.dataset
        if isinstance(ds, PackedTextDataset):
            o = ds.options
            return torch.tensor([TEXT, o.lanes, o.seq_len, int(o.masking), int(o.add_bos)])
        return torch.tensor([PRETOKENIZED, 0, ds.seq_len, int(ds.masking), 0])

    def __iter__(self) -> Iterator[Batch]:
        if isinstance(self.dataset, PretokenizedDataset):  # a new pass continues where the last one stopped
            self.dataset.next_row += self._consumed_rows * self.dataset.dp_world_size
            self._consumed_rows = 0
        for batch in super().__iter__():
            cursor = batch.pop("_cursor")
            if isinstance(self.dataset, PackedTextDataset):
                for lane, doc, offset, rows in cursor.tolist():
                    self.dataset.cursors[lane] = (doc, offset, rows)
            else:
                self._consumed_rows += batch["input"].shape[0]
            labels = batch.pop("labels")
            yield batch, labels

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"layout": self.layout()}
        ds = self.dataset
        if isinstance(ds, PackedTextDataset):
            for lane, cursor in ds.cursors.items():
                state[f"lane_{lane:05d}"] = torch.tensor(cursor, dtype=torch.long)
        else:
            state["next_row"] = torch.tensor(ds.next_row + self._consumed_rows * ds.dp_world_size)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        saved = state_dict.get("layout")
        if saved is None or not torch.equal(torch.as_tensor(saved), self.layout()):
            raise DataConfigError(
                "data loader checkpoint does not match this run: saved [kind, lanes, seq_len, masking, "
                f"add_bos] = {None if saved is None else saved.tolist()}, now {self.layout().tolist()}"
            )
        ds = self.dataset
        if isinstance(ds, PackedTextDataset):
            missing = [v for v in ds.cursors if f"lane_{v:05d}" not in state_dict]
            if missing:
                raise DataConfigError(f"data loader checkpoint lacks cursors for lanes {missing[:8]}...")
            for v in ds.cursors:
                doc, offset, rows = torch.as_tensor(state_dict[f"lane_{v:05d}"]).tolist()
                ds.cursors[v] = (int(doc), int(offset), int(rows))
        else:
            ds.next_row = int(torch.as_tensor(state_dict["next_row"]))
            self._consumed_rows = 0
        self._iterator = None  # workers restart from the restored cursor on the next iter()


def build_dataset(
    config: DataConfig, tokenizer: DataTokenizer, seq_len: int, batch_size: int, dp_rank: int,
    dp_world_size: int, infinite: bool,
) -> PackedTextDataset | PretokenizedDataset:
    if config.pretokenized:
        return PretokenizedDataset(config.pretokenized, seq_len, batch_size, config.document_masking,
                                   infinite, dp_rank, dp_world_size, fingerprint=tokenizer.fingerprint())
    if config.lanes < dp_world_size * max(config.num_workers, 1):
        raise DataConfigError(f"data.lanes={config.lanes} must be >= dp_world_size ({dp_world_size}) x "
                              f"data.num_workers ({config.num_workers})")
    sources = [parse_source(s, config.text_field, config.hub_retries, config.hub_backoff_s)
               for s in config.sources]
    stream = DocumentStream(sources, config.weights, config.seed, infinite)
    options = PackingOptions(seq_len, batch_size, config.lanes, config.document_masking, config.add_bos,
                             config.encode_batch_docs, config.max_doc_chars)
    if config.add_bos and tokenizer.bos_id is None:
        raise DataConfigError(f"data.add_bos is set but tokenizer {tokenizer.source} has no BOS token")
    return PackedTextDataset(stream, tokenizer, options, dp_rank, dp_world_size)


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer: DataTokenizer | None, job_config: Any,
                     infinite: bool = True) -> TitanDataLoader:
    """torchtitan ``build_dataloader_fn``: ``[data]`` settings plus ``training.seq_len/local_batch_size``."""
    config = data_config_from(job_config)
    tokenizer = tokenizer if isinstance(tokenizer, DataTokenizer) else build_tokenizer(job_config)
    training = job_config.training
    dataset = build_dataset(config, tokenizer, training.seq_len, training.local_batch_size, dp_rank,
                            dp_world_size, infinite)
    loader_settings = getattr(training, "dataloader", None)
    return TitanDataLoader(dataset, config.num_workers, config.prefetch_factor,
                           pin_memory=bool(getattr(loader_settings, "pin_memory", False)))
