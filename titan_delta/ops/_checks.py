"""Argument checks shared by the public ops: each failure names the argument and what was expected."""

from __future__ import annotations

from contextlib import AbstractContextManager
from itertools import pairwise

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
BACKENDS = ("auto", "torch", "triton")


def check_tensor(
    name: str,
    x: torch.Tensor,
    ndim: int,
    layout: str,
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
) -> None:
    """Check that ``x`` is a tensor of ``ndim`` dims (described by ``layout``) with an allowed dtype."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have shape {layout} ({ndim} dims), got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({allowed}), got {str(x.dtype).removeprefix('torch.')}")


def check_shape(name: str, x: torch.Tensor, expected: tuple[int, ...], layout: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {layout} = {tuple(expected)}, got {tuple(x.shape)}")


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """All given tensors (None skipped) must share one device; returns it."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all inputs must be on one device, got {listing}")
    return next(iter(devices.values()))


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
