"""Compile a kernel set on a thread pool before its first use: ``precompile(key, body)``.

Why: Triton compiles a kernel when it is first launched, so a stage sequence (the Gated DeltaProduct forward
launches three kernels, its backward four more) compiles them one after another on one thread, each its own
run of MLIR, LLVM and ptxas plus a C launcher built by the host compiler. Triton releases the GIL in
those steps, so the kernels of one sequence compile at the same time on a thread pool in about the time of
the slowest one.

``precompile`` runs ``body`` once with every ``launch`` recorded instead of issued (``body`` allocates its
outputs as usual; no kernel runs, so they stay garbage and are dropped), then compiles and loads every
recorded kernel at once through Triton's own ``warmup`` under its ``AsyncCompileMode``: the same binder,
specialisation and cache as the launch that follows, which then finds each kernel compiled. Once per
``key`` and process; only on a GPU (under the CPU interpreter nothing compiles). If anything in it fails,
nothing is lost: the launches compile one by one as before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from titan_delta_kernels import _launch

try:  # Triton >= 3.5
    from triton.runtime._async_compile import AsyncCompileMode
except ImportError:  # pragma: no cover - older Triton: launches compile one by one
    AsyncCompileMode = None

MAX_WORKERS = 8  # a kernel set has at most a handful of kernels; more threads only add start-up
_DONE: set[Hashable] = set()
_LOCK = threading.Lock()
_enabled = AsyncCompileMode is not None


def set_enabled(enabled: bool) -> bool:
    """Turns precompilation on or off (tests compare both); returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(enabled) and AsyncCompileMode is not None
    return previous


def precompile(key: Hashable, body: Callable[[], Any], device: torch.device) -> None:
    """Compiles every kernel ``body`` launches, all at once, the first time ``key`` is seen on ``device``."""
    if not _enabled or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return
    key = (key, device.index)
    with _LOCK:
        if key in _DONE:
            return
        _DONE.add(key)
    try:
        with _launch.recording() as launches:
            body()
        compile_launches(launches, device)
    except Exception:  # an optimisation only: the real launches then compile what is missing
        return


def compile_launches(launches: list[tuple[Any, tuple, tuple, dict]], device: torch.device) -> None:
    """Compiles (and loads, with their launchers) the kernels of ``launches`` on a thread pool."""
    if not launches:
        return
    workers = min(MAX_WORKERS, len(launches), os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        futures = []
        with AsyncCompileMode(pool):
            for kernel, grid, args, kwargs in launches:
                futures.append(kernel.warmup(*args, grid=grid, **kwargs))
        compiled = {id(k): k for k in (f.result() if hasattr(f, "result") else f for f in futures) if k}

        def load(kernel: Any) -> None:
            torch.cuda.set_device(device)  # Triton loads the module on the thread's current device
            kernel._init_handles()  # the C launcher (host compiler) and the module load

        for done in [pool.submit(load, k) for k in compiled.values()]:
            done.result()
