"""Tensor argument checks of the kernel entry points: each failure names the argument and what was expected.

They read shapes and dtypes only, never values, so a call launches without a host synchronisation.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


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
