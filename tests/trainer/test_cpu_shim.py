"""The CPU shim points torchtitan's device copies at the CPU, and is inert when an accelerator exists."""

from __future__ import annotations

import importlib

import pytest
import torch

from titan_delta.trainer import cpu_shim

COPIES = ("torchtitan.tools.utils", "torchtitan.components.metrics", "torchtitan.distributed.utils")


def test_inert_with_an_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_shim, "accelerator_type", lambda: "cuda")
    sentinel = object()
    for name in COPIES:
        monkeypatch.setattr(importlib.import_module(name), "device_module", sentinel)
    assert cpu_shim.use_cpu_without_accelerator() is False
    assert all(importlib.import_module(name).device_module is sentinel for name in COPIES)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_points_every_copy_at_the_cpu() -> None:
    assert cpu_shim.use_cpu_without_accelerator() is True
    assert cpu_shim.use_cpu_without_accelerator() is True  # idempotent
    for name in COPIES:
        module = importlib.import_module(name)
        assert module.device_type == "cpu"
        assert module.device_module.current_device() == 0  # an index, as barrier(device_ids=...) needs
        assert module.device_module.synchronize is torch.cpu.synchronize
    assert cpu_shim.on_cpu()
