"""Metrics processor that also works on CPU, with a configurable device peak for MFU.

torchtitan's processor builds a CUDA memory monitor unconditionally; on CPU we report the process's
peak resident memory instead (it cannot be reset, so it is the peak since start). MFU needs the
device's dense bf16 peak: ``[metrics] peak_tflops`` overrides torchtitan's table (which knows
A100/H100/H200/B200 and friends); on CPU MFU is NaN — there is no meaningful peak to divide by.
TensorBoard scalars are torchtitan's (loss, grad_norm, throughput(tps), tflops, mfu(%), memory/*,
time_metrics/data_loading*) plus what the trainer passes as extra metrics (lr, skipped steps, tokens).

Weights & Biases (``[metrics] enable_wandb``, docs/wandb.md) gets the same scalars, and the scheduled
evals' ``eval/<task>/<metric>``, through the same logger. Our W&B logger is torchtitan's with these
changes: a missing ``wandb`` package is a config error (torchtitan logs it and trains without W&B),
``WANDB_DIR`` is honoured (torchtitan always writes under the TensorBoard folder), ``WANDB_RUN_TAGS`` is
split at commas (torchtitan passes the string, which W&B reads as one tag per character), the project
defaults to ``titan-delta`` and only variables that are set reach ``wandb.init``, so W&B's own
(``WANDB_ENTITY``, ``WANDB_NAME``, ``WANDB_TAGS``, ``WANDB_RESUME``, ...) apply otherwise.
"""

from __future__ import annotations

import importlib.util
import math
import os
import resource
import time
from datetime import datetime
from typing import Any

import torch
from torchtitan.components.metrics import (
    BaseLogger,
    DeviceMemStats,
    LoggerContainer,
    MetricsProcessor,
    TensorBoardLogger,
    WandBLogger,
    _get_metrics_rank,
    build_device_memory_monitor,
)
from torchtitan.config import JobConfig
from torchtitan.distributed import ParallelDims
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from titan_delta.trainer.config_error import ConfigError
from titan_delta.trainer.cpu_shim import on_cpu

_GIB = 1024**3
WANDB_PROJECT = "titan-delta"
# wandb.init argument <- environment variable (torchtitan's names; W&B reads its own when these are unset)
_WANDB_ENV = {
    "entity": "WANDB_TEAM",
    "name": "WANDB_RUN_NAME",
    "id": "WANDB_RUN_ID",
    "notes": "WANDB_RUN_NOTES",
    "group": "WANDB_RUN_GROUP",
    "job_type": "WANDB_RUN_JOB_TYPE",
    "resume_from": "WANDB_RESUME_FROM",
    "fork_from": "WANDB_FORK_FROM",
}


class HostMemoryMonitor:
    """DeviceMemoryMonitor look-alike for CPU training: peak RSS of this process."""

    device_name = "CPU"

    def __init__(self) -> None:
        self.capacity_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def get_peak_stats(self) -> DeviceMemStats:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        pct = 100.0 * peak / self.capacity_bytes
        return DeviceMemStats(peak / _GIB, pct, peak / _GIB, pct, 0, 0)

    def reset_peak_stats(self) -> None:
        """The kernel's peak RSS cannot be reset; the reported value is the peak since start."""


def peak_flops(job_config: JobConfig, device_name: str) -> float:
    """FLOP/s of one device for MFU: the config override, NaN on CPU, else torchtitan's table."""
    override = float(getattr(job_config.metrics, "peak_tflops", 0.0))
    if override < 0:
        raise ValueError(f"[metrics] peak_tflops = {override}: expected >= 0 (0 = use the built-in table)")
    if override > 0:
        return override * 1e12
    if on_cpu():
        return math.nan
    return utils.get_peak_flops(device_name)


class TitanDeltaWandBLogger(WandBLogger):
    """torchtitan's ``WandBLogger`` (same ``log``/``close``) with the changes the module docstring lists."""

    def __init__(self, log_dir: str, job_config: JobConfig, tag: str | None = None) -> None:
        import wandb

        self.wandb, self.tag = wandb, tag
        run_dir = os.environ.get("WANDB_DIR") or log_dir
        os.makedirs(run_dir, exist_ok=True)
        kwargs: dict[str, Any] = {k: os.environ[v] for k, v in _WANDB_ENV.items() if os.environ.get(v)}
        if os.environ.get("WANDB_RUN_TAGS"):
            kwargs["tags"] = [t.strip() for t in os.environ["WANDB_RUN_TAGS"].split(",") if t.strip()]
        project = os.environ.get("WANDB_PROJECT") or WANDB_PROJECT
        self.run = wandb.init(project=project, dir=run_dir, config=job_config.to_dict(), **kwargs)
        name = self.run.name or self.run.id
        logger.info(f"W&B logging enabled: project {project}, run {name}, files in {self.run.dir}")


def require_wandb(job_config: JobConfig) -> None:
    """``[metrics] enable_wandb`` without the package is a config error on every rank."""
    if getattr(job_config.metrics, "enable_wandb", False) and importlib.util.find_spec("wandb") is None:
        raise ConfigError("[metrics] enable_wandb = true needs the wandb package (pip install wandb)")


def build_metric_logger(
    job_config: JobConfig, parallel_dims: ParallelDims, tag: str | None = None
) -> BaseLogger:
    """torchtitan's ``_build_metric_logger`` (the metrics rank logs to ``<dump>/<save_tb_folder>/<date>``)
    with :class:`TitanDeltaWandBLogger`. A failing ``wandb.init`` (no API key online, no network) is
    logged and the run goes on without W&B, as in torchtitan."""
    metrics = job_config.metrics
    require_wandb(job_config)
    if not (metrics.enable_tensorboard or metrics.enable_wandb):
        return BaseLogger()
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if not metrics.save_for_all_ranks and rank != _get_metrics_rank(parallel_dims, job_config):
        return BaseLogger()
    stamp = datetime.now().strftime("%Y%m%d-%H%M")
    log_dir = os.path.join(job_config.job.dump_folder, metrics.save_tb_folder, stamp)
    if job_config.fault_tolerance.enable:
        log_dir = os.path.join(log_dir, f"replica_{job_config.fault_tolerance.replica_id}")
    if metrics.save_for_all_ranks:
        log_dir = os.path.join(log_dir, f"rank_{rank}")
    loggers = LoggerContainer()
    if metrics.enable_wandb:
        try:
            loggers.add_logger(TitanDeltaWandBLogger(log_dir, job_config, tag))
        except Exception as err:
            reason = " ".join(line.strip() for line in str(err).splitlines() if line.strip())[:400]
            logger.error(f"W&B is off for this run: wandb.init failed: {type(err).__name__}: {reason}")
    if metrics.enable_tensorboard:
        loggers.add_logger(TensorBoardLogger(log_dir, tag))
    return loggers


class TitanDeltaMetricsProcessor(MetricsProcessor):
    """MetricsProcessor with a CPU memory monitor, the peak-FLOPs override and our W&B logger."""

    def __init__(self, job_config: JobConfig, parallel_dims: ParallelDims, tag: str | None = None) -> None:
        # Not calling super().__init__: it builds a CUDA memory monitor even on CPU. Same attributes.
        self.logger = build_metric_logger(job_config, parallel_dims, tag)
        self.parallel_dims = parallel_dims
        self.job_config = job_config
        self.device_memory_monitor = HostMemoryMonitor() if on_cpu() else build_device_memory_monitor()
        disable_color = job_config.metrics.disable_color_printing
        self.color = utils.NoColor() if disable_color else utils.Color()
        self.gpu_peak_flops = peak_flops(job_config, self.device_memory_monitor.device_name)
        logger.info(f"Peak FLOP/s per device used for MFU: {self.gpu_peak_flops:.3e}")
        self.ntokens_since_last_log = 0
        self.data_loading_times = []
        self.time_last_log = time.perf_counter()
        self.device_memory_monitor.reset_peak_stats()
        self.num_flops_per_token = -1
        self.optimizers = None
        self.lr_schedulers = None
        self.model_parts = None


def build_metrics_processor(
    job_config: JobConfig,
    parallel_dims: ParallelDims,
    model_args: object | None = None,
    tag: str | None = None,
) -> TitanDeltaMetricsProcessor:
    """TrainSpec ``build_metrics_processor_fn``."""
    del model_args
    return TitanDeltaMetricsProcessor(job_config, parallel_dims, tag)
