"""A thin torchtitan Trainer subclass: only what the base class has no hook for.

- The model args are the flavor's with the ``[model]`` field overrides applied
  (:mod:`titan_delta.trainer.model_overrides`), and the tokenizer's vocabulary reaches them: torchtitan
  0.2.2 calls ``update_from_config(job_config)`` without it, so we call it with the tokenizer first.
- ``[parallelism] data_parallel_replicate_degree = -1`` means every rank the shard degree leaves.
- ``[training] seed`` (default 0) seeds the run unless ``[debug] seed`` is set, so identical configs
  train identically.
- Checkpoints carry completion markers (:mod:`titan_delta.trainer.checkpoint`) recording the resolved
  ModelArgs, and the RNG states.
- ``train_step`` applies the NaN/Inf policy (:mod:`titan_delta.trainer.nonfinite`), logs the LR and
  the skipped-step count, and runs the scheduled lm-eval tasks (:mod:`titan_delta.eval.scheduled`);
  otherwise it is the base step (token-normalised loss, grad accumulation, clipping). Varlen metadata
  (``cu_seqlens``) needs no hook: the base trainer passes every loader key other than ``input`` to the
  model as a keyword argument.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import torch
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.config import JobConfig
from torchtitan.distributed import utils as dist_utils
from torchtitan.protocols import train_spec as train_spec_module
from torchtitan.train import Trainer

from titan_delta.eval.scheduled import ScheduledEvaluator
from titan_delta.hf.export_folder import model_args_dict
from titan_delta.trainer.checkpoint import MarkedCheckpointManager
from titan_delta.trainer.config_checks import ConfigError
from titan_delta.trainer.model_overrides import resolve_job_model_args
from titan_delta.trainer.nonfinite import NonFinitePolicy, PendingGradNorm, arm_device_side_skip

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


def resolve_replicate_degree(parallelism: Any, world_size: int, local_world_size: int | None = None) -> None:
    """``data_parallel_replicate_degree = -1``: every rank the shard degree leaves, so one config runs DDP
    (shard degree 1) or HSDP (shard degree = GPUs per node) on any number of GPUs or nodes; torchtitan
    infers only the shard degree. With ``data_parallel_shard_degree = -1`` as well, the shard degree is the
    ranks of one node (``local_world_size``, torchrun's LOCAL_WORLD_SIZE): FSDP on one node, HSDP (shard
    inside a node, replicate across) on several."""
    if parallelism.data_parallel_replicate_degree != -1:
        return
    shard = parallelism.data_parallel_shard_degree
    if shard == -1:
        shard = local_world_size or world_size
        parallelism.data_parallel_shard_degree = shard
    if world_size % shard:
        raise ConfigError(
            f"[parallelism] data_parallel_replicate_degree = -1: the {world_size} ranks do not divide by "
            f"data_parallel_shard_degree = {shard}"
        )
    parallelism.data_parallel_replicate_degree = world_size // shard


class TitanDeltaTrainer(Trainer):
    def __init__(self, job_config: JobConfig) -> None:
        if job_config.debug.seed is None:  # torchtitan would draw a random seed
            job_config.debug.seed = job_config.training.seed
        resolve_replicate_degree(
            job_config.parallelism,
            int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in os.environ else None,
        )
        self.nonfinite = NonFinitePolicy(job_config.nan_policy.max_skipped_steps)
        self._pending_grad_norm: PendingGradNorm | None = None
        spec = train_spec_module.get_train_spec(job_config.model.name)
        # Built afresh from the registry's flavor (never the spec's entry, which an earlier trainer in
        # this process may have changed), then handed to torchtitan in the spec's table.
        args = resolve_job_model_args(job_config)
        spec.model_args[job_config.model.flavor] = args
        if spec.build_tokenizer_fn is not None:
            args.update_from_config(job_config, tokenizer=spec.build_tokenizer_fn(job_config))
        super().__init__(job_config)
        self._use_marked_checkpoints()
        self.evaluator = ScheduledEvaluator(
            job_config.eval,
            self.tokenizer,
            job_config.job.dump_folder,
            metric_logger=self.metrics_processor.logger,
            add_bos=job_config.data.add_bos,
        )

    def _use_marked_checkpoints(self) -> None:
        self.checkpointer.close()
        self.checkpointer = MarkedCheckpointManager(
            dataloader=self.dataloader,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self},
            checkpoint_config=self.job_config.checkpoint,
            sd_adapter=None,
            base_folder=self.job_config.job.dump_folder,
            model_record={
                "model_name": self.job_config.model.name,
                "flavor": self.job_config.model.flavor,
                "model_args": model_args_dict(self.model_args),
            },
        )

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor on the training device. To a GPU through pinned memory and without blocking: a copy
        from pageable memory first waits for every kernel queued on the stream, which would leave the GPU
        idle while the host launches the next kernels."""
        if self.device.type == "cuda" and tensor.device.type == "cpu":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.to(self.device)

    def _global_valid_tokens(self, local_valid_tokens: torch.Tensor) -> torch.Tensor | float:
        local_valid_tokens = self._to_device(local_valid_tokens)
        if self.parallel_dims.dp_enabled:
            return dist_utils.dist_sum(local_valid_tokens, self.parallel_dims.get_mesh("batch"))
        return local_valid_tokens.float()

    def train_step(self, data_iterator: Iterator[Batch]) -> None:
        self.optimizers.zero_grad()
        lr = self.lr_schedulers.schedulers[0].get_last_lr()[0]
        microbatches = [next(data_iterator) for _ in range(self.gradient_accumulation_steps)]
        local_valid_tokens = sum(
            ((labels != IGNORE_INDEX).sum() for _, labels in microbatches), torch.tensor(0)
        )
        global_valid_tokens = self._global_valid_tokens(local_valid_tokens)

        losses = []
        for input_dict, labels in microbatches:
            on_device = {
                k: self._to_device(v) if isinstance(v, torch.Tensor) else v for k, v in input_dict.items()
            }
            loss = self.forward_backward_step(
                input_dict=on_device, labels=self._to_device(labels), global_valid_tokens=global_valid_tokens
            )
            losses.append(loss.detach())

        self.settle_grad_norm()  # the previous step's, read while this step's kernels run
        grad_norm = dist_utils.clip_grad_norm_(
            [p for m in self.model_parts for p in m.parameters()],
            self.job_config.training.max_norm,
            foreach=True,
        )
        self.checkpointer.maybe_wait_for_staging()  # an async save's staging copy precedes the update
        loss = torch.sum(torch.stack(losses))
        last_step = self.step == self.job_config.training.steps
        log = self.metrics_processor.should_log(self.step)
        if arm_device_side_skip(self.optimizers.optimizers, grad_norm):
            self.optimizers.step()  # skipped on the device if the norm is not finite
            self._pending_grad_norm = PendingGradNorm(self.step, grad_norm, loss)
            grad_norm_value = self.settle_grad_norm() if log or last_step else None
        else:
            grad_norm_value = grad_norm.item()  # the host decides before the update
            local_loss = None if math.isfinite(grad_norm_value) else loss.item()
            if self.nonfinite.should_skip(self.step, grad_norm_value, local_loss):
                self.optimizers.zero_grad()
            else:
                self.optimizers.step()
        self.lr_schedulers.step()

        if log:
            self._log(loss, local_valid_tokens, global_valid_tokens, grad_norm_value, lr)
        if self.evaluator.due(self.step, last_step):
            # every rank takes part: the sharded forward is collective
            tokens_seen = self._global_tokens_seen()
            self.evaluator.maybe_run(self.step, tokens_seen, self.model_parts[0], last_step=last_step)

    def settle_grad_norm(self) -> float | None:
        """Apply the skip policy (count, warn, stop) to the step whose norm is still on its way to the host,
        if any, and return that norm; the device already skipped the update if it was not finite."""
        pending, self._pending_grad_norm = self._pending_grad_norm, None
        if pending is None:
            return None
        value = pending.value()
        local_loss = None if math.isfinite(value) else pending.loss.item()
        self.nonfinite.should_skip(pending.step, value, local_loss)
        return value

    def _log(
        self,
        loss: torch.Tensor,
        local_valid_tokens: torch.Tensor,
        global_valid_tokens: torch.Tensor | float,
        grad_norm: float,
        lr: float,
    ) -> None:
        """``loss`` is this rank's loss sum / global valid tokens, so the global mean is its sum."""
        if self.parallel_dims.dp_enabled:
            mesh = self.parallel_dims.get_optional_mesh("loss")
            local_mean = loss * global_valid_tokens / local_valid_tokens.to(self.device)
            avg_loss = dist_utils.dist_sum(loss, mesh)
            max_loss = dist_utils.dist_max(local_mean, mesh)
        else:
            avg_loss = max_loss = loss.item()
        tokens_seen = self._global_tokens_seen()
        extra = {"n_tokens_seen": tokens_seen, "lr": lr, "skipped_steps": self.nonfinite.skipped_steps}
        self.metrics_processor.log(self.step, avg_loss, max_loss, grad_norm, extra_metrics=extra)

    def _global_tokens_seen(self) -> int:
        """Tokens consumed by all data-parallel ranks so far (``ntokens_seen`` counts this rank's)."""
        if not self.parallel_dims.dp_enabled:
            return int(self.ntokens_seen)
        mesh = self.parallel_dims.get_optional_mesh("loss")
        local = torch.tensor(self.ntokens_seen, dtype=torch.int64, device=self.device)
        return int(dist_utils.dist_sum(local, mesh))

    def state_dict(self) -> dict[str, Any]:
        """Step counters, skipped steps and the RNG states (torchtitan saves no RNG): all SPMD ranks share
        one seed, so DCP's de-duplicated copy of rank 0's state is every rank's state."""
        self.settle_grad_norm()  # the saved count includes the last step
        state = {**super().state_dict(), **self.nonfinite.state_dict(), "rng_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.nonfinite.load_state_dict(state_dict)
        if "rng_cpu" in state_dict:
            torch.set_rng_state(state_dict["rng_cpu"].cpu())
        if "rng_cuda" in state_dict and self.device.type == "cuda":
            torch.cuda.set_rng_state(state_dict["rng_cuda"].cpu(), self.device)
