"""Argument checks shared by the public ops: each failure names the argument and what was expected."""

from __future__ import annotations

from contextlib import AbstractContextManager
from itertools import pairwise

import torch

from titan_delta_kernels._checks import FLOAT_DTYPES, check_same_device, check_shape, check_tensor

__all__ = [
    "FLOAT_DTYPES",
    "check_backend",
    "check_cu_seqlens",
    "check_same_device",
    "check_shape",
    "check_tensor",
    "reference_precision",
]

BACKENDS = ("auto", "torch", "triton")


def check_cu_seqlens(cu_seqlens: torch.Tensor | None, batch: int, total: int) -> None:
    """``cu_seqlens`` must be int32/int64 ``[N+1]``, start at 0, end at ``total``, never decrease, with B = 1.

    Values are checked only for CPU tensors: reading a device tensor's values would synchronise the
    host with the GPU on every call, which the varlen kernels exist to avoid. On a GPU only the dtype,
    rank and length are checked and the offsets are trusted.
    """
    if cu_seqlens is None:
        return
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a 1-D int32/int64 tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1:
        raise TypeError(
            f"cu_seqlens must be a 1-D int32/int64 tensor [N+1], got dtype {cu_seqlens.dtype} "
            f"and shape {tuple(cu_seqlens.shape)}"
        )
    if batch != 1:
        raise ValueError(
            f"with cu_seqlens the batch size must be 1 (documents packed along T), got B={batch}"
        )
    if cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens must hold at least [0, T] (N+1 >= 2 entries)")
    if cu_seqlens.device.type != "cpu":
        return
    values = cu_seqlens.tolist()
    if values[0] != 0 or values[-1] != total:
        raise ValueError(f"cu_seqlens must start at 0 and end at T={total}, got {values[0]}..{values[-1]}")
    if any(b < a for a, b in pairwise(values)):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {values}")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def reference_precision(x: torch.Tensor) -> AbstractContextManager:
    """Autocast off around a PyTorch reference: it upcasts its inputs itself, and autocast would otherwise
    run its matmuls (the triangular solves' inputs included) in bf16/fp16."""
    return torch.autocast(device_type=x.device.type, enabled=False)
