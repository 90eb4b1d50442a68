"""Scheduled lm-eval runs inside a training job: ``ScheduledEvaluator.maybe_run`` after a train step.

Evaluation must not change training: the model goes to eval mode without gradients and comes back in
exactly the modes it had, and every RNG that lm-eval or the model might draw from (Python, NumPy, torch
CPU and CUDA) is restored, so a run with evals produces the same training trajectory as one without.
The data loader is never touched. Failures (unknown task, unreachable dataset, an error in the
harness) are logged as warnings and the call returns: training goes on.

Call it on every rank with the live model: each rank scores a share of the requests (the forwards of a
sharded model are collective). Only rank 0 writes TensorBoard scalars and the JSONL file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from titan_delta.eval.config import EvalConfig

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def preserved_rng_state() -> Iterator[None]:
    """Restore Python, NumPy, torch CPU and (when initialised) CUDA RNG states on exit."""
    py_state, np_state, cpu_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


@contextlib.contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """eval() + no_grad, then every submodule back in the mode it had and every FSDP module resharded.

    A forward without a backward leaves FSDP2 modules that do not reshard after forward (the root, by
    torchtitan's choice) holding their unsharded parameters as the registered ones. The optimizer's
    parameters are the sharded ones, so the next optimizer state dict (a checkpoint save) would look up
    parameters the model no longer reports and fail.
    """
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in modes:
            module.training = training
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def log_scalars(metric_logger: Any, scalars: dict[str, float], step: int) -> None:
    """TensorBoard ``SummaryWriter`` (add_scalar) or torchtitan's metric logger (log(dict, step))."""
    if metric_logger is None or not scalars:
        return
    if hasattr(metric_logger, "add_scalar"):
        for tag, value in scalars.items():
            metric_logger.add_scalar(tag, value, step)
        if hasattr(metric_logger, "flush"):
            metric_logger.flush()
    elif hasattr(metric_logger, "log"):
        metric_logger.log(scalars, step)
    else:
        raise TypeError(f"metric logger {type(metric_logger).__name__} has neither add_scalar nor log")


class ScheduledEvaluator:
    """Args:
    config: the ``[eval]`` section. tokenizer: the training tokenizer.
    dump_folder: the job's dump folder (the JSONL path is relative to it).
    metric_logger: SummaryWriter-like (``add_scalar``) or torchtitan logger (``log``); None = JSONL only.
    add_bos: the ``[data] add_bos`` setting the model was trained with.
    process_group: ranks that evaluate together (default: the world).
    """

    def __init__(
        self,
        config: EvalConfig,
        tokenizer: Any,
        dump_folder: str,
        *,
        metric_logger: Any = None,
        add_bos: bool = False,
        process_group: Any = None,
    ) -> None:
        config.validate()
        self.config, self.tokenizer = config, tokenizer
        self.results_path = os.path.join(dump_folder, config.results_file)
        self.metric_logger, self.add_bos, self.process_group = metric_logger, add_bos, process_group
        self.last_eval_step: int | None = None

    def due(self, step: int, last_step: bool = False) -> bool:
        c = self.config
        if not c.enable or step == self.last_eval_step:
            return False
        return (c.interval > 0 and step % c.interval == 0) or (last_step and c.at_end)

    def maybe_run(
        self, step: int, tokens_seen: int | torch.Tensor, model: nn.Module, *, last_step: bool = False
    ) -> dict[str, dict[str, float]] | None:
        """Evaluate when ``step`` is due; returns {task: {metric: value}} on rank 0 (None otherwise, when
        not due, or when the eval failed). Never raises."""
        if not self.due(step, last_step):
            return None
        self.last_eval_step = step
        started = time.perf_counter()
        try:
            with preserved_rng_state(), evaluation_mode(model):
                metrics, failed, rank = self._evaluate(model)
        except Exception as err:  # the eval must never take the training job down
            logger.warning(f"eval at step {step} failed and was skipped: {type(err).__name__}: {err}")
            return None
        if rank != 0:
            return None
        seconds = time.perf_counter() - started
        try:
            self._record(step, int(tokens_seen), metrics, failed, seconds)
        except Exception as err:
            logger.warning(f"eval at step {step}: could not record the results: {type(err).__name__}: {err}")
        summary = ", ".join(f"{t}/{m}={v:.4g}" for t, ms in metrics.items() for m, v in ms.items())
        logger.info(f"eval at step {step} ({seconds:.1f}s): {summary or 'no results'}")
        return metrics

    def _evaluate(self, model: nn.Module) -> tuple[dict[str, dict[str, float]], dict[str, str], int]:
        from titan_delta.eval.adapter import TitanDeltaEvalLM
        from titan_delta.eval.harness import flatten_metrics, run_tasks
        from titan_delta.eval.local_tasks import expand_task_names

        c = self.config
        lm = TitanDeltaEvalLM(
            model, self.tokenizer, batch_size=c.batch_size, max_length=c.max_length or None,
            add_bos=self.add_bos, process_group=self.process_group,
        )  # fmt: skip
        outcome = run_tasks(
            lm, expand_task_names(c.tasks), limit=c.limit_arg,
            num_fewshot=None if c.num_fewshot < 0 else c.num_fewshot,
            bootstrap_iters=c.bootstrap_iters, seed=c.seed,
        )  # fmt: skip
        metrics = flatten_metrics(outcome.results) if outcome.results is not None else {}
        return metrics, outcome.failed, lm.share.rank

    def _record(
        self, step: int, tokens_seen: int, metrics: dict[str, dict[str, float]], failed: dict[str, str],
        seconds: float,
    ) -> None:  # fmt: skip
        scalars = {f"eval/{task}/{name}": value for task, ms in metrics.items() for name, value in ms.items()}
        log_scalars(self.metric_logger, scalars, step)
        c = self.config
        common = {"step": step, "tokens_seen": tokens_seen, "num_fewshot": c.num_fewshot, "limit": c.limit}
        lines = [
            {**common, "task": task, "metrics": ms, "seconds": round(seconds, 3)}
            for task, ms in metrics.items()
        ]
        lines += [{**common, "task": task, "metrics": {}, "error": reason} for task, reason in failed.items()]
        os.makedirs(os.path.dirname(self.results_path) or ".", exist_ok=True)
        with open(self.results_path, "a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
