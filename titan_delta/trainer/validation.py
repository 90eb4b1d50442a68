"""Held-out validation loss during training: the TrainSpec's ``build_validator_fn``.

The held-out set is ``[validation] dataset_path`` (any ``[data] sources`` spelling: ``jsonl:GLOB``,
``parquet:GLOB``, ``txt:GLOB``, a bare glob, ``hf:...``), read once through the data pipeline with the
``[data]`` tokenizer, text field and masking, packed into ``[training] seq_len`` rows by one lane, not
repeated. Every rank reads the same row sequence and scores rows ``r, r + W, ...`` of its first
``steps x local_batch_size x W`` rows (all rows for ``steps = -1``), trimmed to a multiple of ``W`` so
every rank runs the same number of (collective, under FSDP) forwards. The scored rows therefore do not
depend on the data-parallel layout, and they are the same at every validation: the set is reread from
its start each time and the training loader is never touched.

Logged: ``validation/loss`` (the token-mean cross-entropy over all ranks' scored tokens) and
``validation/bpb`` (total nats / ln 2 / total UTF-8 bytes of the scored target tokens; special tokens
count 0 bytes). The model runs in eval mode without gradients and every FSDP module is resharded
afterwards; RNG states are restored, so a run with validation trains exactly like one without.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.components.validate import BaseValidator

from titan_delta.data.config import data_config_from
from titan_delta.data.loader import build_dataset
from titan_delta.eval.scheduled import evaluation_mode, log_scalars, preserved_rng_state

logger = logging.getLogger(__name__)
Batch = dict[str, torch.Tensor]


def token_byte_lengths(tokenizer: Any, size: int) -> np.ndarray:
    """UTF-8 bytes each token id stands for (0 for special and unknown ids), ``size`` entries."""
    lengths = np.zeros(size, dtype=np.int64)
    encoding = getattr(tokenizer, "encoding", None)  # tiktoken: exact bytes, even for partial characters
    specials = {tokenizer.eos_id, tokenizer.bos_id}
    if encoding is not None:
        specials |= set(encoding._special_tokens.values())
    for i in range(min(size, tokenizer.get_vocab_size())):
        if i in specials:
            continue
        try:
            raw = encoding.decode_single_token_bytes(i) if encoding is not None else None
        except KeyError:  # a gap in the ranks
            continue
        lengths[i] = len(raw) if raw is not None else len(tokenizer.decode([i]).encode("utf-8"))
    return lengths


class HeldOutValidator(BaseValidator):
    def __init__(
        self,
        job_config: Any,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any,
        parallel_dims: Any,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        validation_context: Callable[[], AbstractContextManager[None]],
        maybe_enable_amp: AbstractContextManager[None],
        metrics_processor: Any,
        pp_schedule: Any = None,
        **_: Any,
    ) -> None:
        super().__init__(job_config)
        if pp_schedule is not None:
            raise ValueError("[validation] is not supported with pipeline parallelism")
        self.dp_world_size, self.dp_rank = dp_world_size, dp_rank
        self.tokenizer, self.parallel_dims, self.loss_fn = tokenizer, parallel_dims, loss_fn
        self.validation_context, self.maybe_enable_amp = validation_context, maybe_enable_amp
        self.metrics_processor = metrics_processor
        self._byte_lengths: torch.Tensor | None = None

    def should_validate(self, step: int) -> bool:
        # The last step too: a run's final validation loss is the one runs are compared by.
        return step % self.job_config.validation.freq == 0 or step == self.job_config.training.steps

    def _held_out_rows(self) -> Iterator[Batch]:
        """Single rows (batch dimension 1) of the held-out set from its start, in a fixed order."""
        data = dataclasses.replace(
            data_config_from(self.job_config),
            sources=[self.job_config.validation.dataset_path], weights=[], lanes=1, num_workers=0,
            pretokenized="",
        )  # fmt: skip
        dataset = build_dataset(data, self.tokenizer, self.job_config.training.seq_len, 1, 0, 1, False)
        for row in dataset:
            row.pop("_cursor")
            yield row

    def _my_batches(self) -> list[Batch]:
        v, world = self.job_config.validation, self.dp_world_size
        limit = v.steps * v.local_batch_size * world if v.steps != -1 else None
        mine: list[Batch] = []
        total = 0
        for index, row in enumerate(self._held_out_rows()):
            if limit is not None and index >= limit:
                break
            total += 1
            if index % world == self.dp_rank:
                mine.append(row)
        mine = mine[: total // world]  # every rank the same number of rows, so the same forwards
        if not mine:
            raise ValueError(
                f"[validation] dataset_path = {v.dataset_path!r}: fewer than {world} rows of "
                f"seq_len + 1 = {self.job_config.training.seq_len + 1} tokens"
            )
        return [_stack(mine[i : i + v.local_batch_size]) for i in range(0, len(mine), v.local_batch_size)]

    def validate(self, model_parts: list[nn.Module], step: int) -> None:
        (model,) = model_parts
        started = time.perf_counter()
        device = next(model.parameters()).device
        if self._byte_lengths is None:
            size = self.tokenizer.get_vocab_size()
            self._byte_lengths = torch.from_numpy(token_byte_lengths(self.tokenizer, size))
        totals = torch.zeros(3, dtype=torch.float64)  # nats, tokens, bytes
        with preserved_rng_state(), evaluation_mode(model):
            for batch in self._my_batches():
                labels = batch.pop("labels")
                inputs = batch.pop("input").to(device)
                extra = {k: t.to(device) for k, t in batch.items()}
                with self.validation_context(), self.maybe_enable_amp:
                    pred = model(inputs, **extra)
                    loss_sum = self.loss_fn(pred, labels.to(device))
                scored = labels[labels != IGNORE_INDEX]
                totals += torch.tensor(
                    [float(loss_sum), scored.numel(), float(self._byte_lengths[scored].sum())],
                    dtype=torch.float64,
                )
                del pred
        if self.parallel_dims.dp_enabled:
            totals = totals.to(device)
            dist.all_reduce(totals, group=self.parallel_dims.get_mesh("batch").get_group())
        nats, tokens, nbytes = totals.tolist()
        loss = nats / tokens if tokens else math.nan
        bpb = nats / math.log(2) / nbytes if nbytes else math.nan
        log_scalars(self.metrics_processor.logger, {"validation/loss": loss, "validation/bpb": bpb}, step)
        logger.info(
            f"validation at step {step}: loss {loss:.4f}, bpb {bpb:.4f} ({int(tokens)} tokens, "
            f"{time.perf_counter() - started:.1f}s)"
        )


def _stack(rows: list[Batch]) -> Batch:
    """Rows of one token row each into one batch; ``cu_seqlens`` offsets move to the flat B·T layout."""
    batch = {"input": torch.cat([r["input"] for r in rows]), "labels": torch.cat([r["labels"] for r in rows])}
    if "cu_seqlens" in rows[0]:
        seq_len = rows[0]["input"].shape[1]
        bounds = [r["cu_seqlens"][:-1] + b * seq_len for b, r in enumerate(rows)]
        end = torch.tensor([len(rows) * seq_len], dtype=rows[0]["cu_seqlens"].dtype)
        batch["cu_seqlens"] = torch.cat([*bounds, end])
    return batch


def build_validator(**kwargs: Any) -> HeldOutValidator:
    """torchtitan ``build_validator_fn`` (called with keyword arguments only)."""
    return HeldOutValidator(**kwargs)
