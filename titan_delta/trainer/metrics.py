"""Metrics processor that also works on CPU, with a configurable device peak for MFU.

torchtitan's processor builds a CUDA memory monitor unconditionally; on CPU we report the process's
peak resident memory instead (it cannot be reset, so it is the peak since start). MFU needs the
device's dense bf16 peak: ``[metrics] peak_tflops`` overrides torchtitan's table (which knows
A100/H100/H200/B200 and friends); on CPU MFU is NaN — there is no meaningful peak to divide by.
TensorBoard scalars are torchtitan's (loss, grad_norm, throughput(tps), tflops, mfu(%), memory/*,
time_metrics/data_loading*) plus what the trainer passes as extra metrics (lr, skipped steps, tokens).
"""

from __future__ import annotations

import math
import os
import resource
import time

from torchtitan.components.metrics import (
    DeviceMemStats,
    MetricsProcessor,
    _build_metric_logger,
    build_device_memory_monitor,
)
from torchtitan.config import JobConfig
from torchtitan.distributed import ParallelDims
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from titan_delta.trainer.cpu_shim import on_cpu

_GIB = 1024**3


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


class TitanDeltaMetricsProcessor(MetricsProcessor):
    """MetricsProcessor with a CPU memory monitor and the peak-FLOPs override."""

    def __init__(self, job_config: JobConfig, parallel_dims: ParallelDims, tag: str | None = None) -> None:
        # Not calling super().__init__: it builds a CUDA memory monitor even on CPU. Same attributes.
        self.logger = _build_metric_logger(job_config, parallel_dims, tag)
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
