"""Run torchtitan's Trainer on CPU (gloo) when the machine has no accelerator.

torchtitan 0.2.2 decides its device once, at import time (``tools/utils.get_device_info``), and falls
back to ``"cuda"`` when no accelerator exists; four modules then keep their own copies of that choice.
We rebind those module attributes to ``"cpu"`` / ``torch.cpu`` from our entry point: no file in
site-packages changes, and nothing happens at all when an accelerator is present.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch
from torch._utils import _get_available_device_type

# Modules that copied ``device_type`` / ``device_module`` out of torchtitan.tools.utils when imported.
_MODULES_WITH_DEVICE_COPIES = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.tools.profiling",
)


class CpuDeviceModule(ModuleType):
    """``torch.cpu`` with an integer ``current_device()``: torchtitan passes it to
    ``barrier(device_ids=...)``, which takes indices; ``torch.cpu.current_device()`` returns "cpu"."""

    def __init__(self) -> None:
        super().__init__("titan_delta_cpu_device_module")

    def __getattr__(self, name: str) -> object:
        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> int:
        return 0


def accelerator_type() -> str | None:
    """The accelerator torch sees ("cuda", "xpu", ...), or None on a CPU-only machine."""
    return _get_available_device_type()


def training_device_type() -> str:
    """Where training runs: the accelerator if there is one, else the CPU."""
    return accelerator_type() or "cpu"


def use_cpu_without_accelerator() -> bool:
    """Point torchtitan at the CPU if no accelerator exists; returns True when it did so.

    Idempotent, and a no-op (returns False) whenever torch reports an accelerator.
    """
    if accelerator_type() is not None:
        return False
    cpu_module = CpuDeviceModule()
    for name in _MODULES_WITH_DEVICE_COPIES:
        module = importlib.import_module(name)
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = cpu_module
    return True


def on_cpu() -> bool:
    """True when torchtitan has been pointed at the CPU (after :func:`use_cpu_without_accelerator`)."""
    from torchtitan.tools import utils

    return utils.device_type == "cpu"
