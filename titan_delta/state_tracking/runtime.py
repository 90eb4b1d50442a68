"""Where and how a run executes: device choice, mixed precision, and host-to-device batch copies that do
not stall the host (pinned memory, non-blocking), so the training loop only syncs when it logs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from titan_delta.state_tracking.tasks import TaskBatch


def resolve_device(name: str) -> torch.device:
    """``auto`` takes CUDA when a GPU is visible, else the CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("training.device='cuda' but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"training.device must be 'auto', 'cpu' or 'cuda', got {name!r}")
    return torch.device(name)


def device_description(device: torch.device) -> str:
    """What ran the job, for the report: the GPU's name on CUDA."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return str(device)


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """bf16 autocast for ``precision='bf16'``; plain fp32 otherwise. The DeltaFormer / Gated DeltaProduct
    ops keep fp32 math inside (their torch references turn autocast off)."""
    if precision == "fp32":
        yield
        return
    if precision != "bf16":
        raise ValueError(f"training.precision must be 'fp32' or 'bf16', got {precision!r}")
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        yield


def batch_to_device(batch: TaskBatch, device: torch.device) -> TaskBatch:
    """CPU batches stay put; CUDA batches go through pinned memory with non_blocking copies, which unlike a
    plain ``.to('cuda')`` from pageable memory do not synchronise the stream."""
    if device.type != "cuda":
        return batch.to(device)
    inputs, targets = (t.pin_memory().to(device, non_blocking=True) for t in (batch.inputs, batch.targets))
    return TaskBatch(inputs, targets)
