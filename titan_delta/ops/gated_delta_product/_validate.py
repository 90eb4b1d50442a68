"""Argument validation shared by the public op and both references, so every entry point fails alike."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from titan_delta.ops._checks import (
    check_cu_seqlens,
    check_same_device,
    check_shape,
    check_tensor,
)

STATE_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class GDPDims:
    """Sizes of one call: B batch, T tokens, H heads, K/V head dims, n_h steps per token, N sequences."""

    batch: int
    tokens: int
    heads: int
    key_dim: int
    value_dim: int
    num_householder: int
    num_sequences: int
    scale: float
    compute_dtype: torch.dtype


def compute_dtype_of(*tensors: torch.Tensor | None) -> torch.dtype:
    """fp64 math when any input is fp64 (gradcheck, oracles); fp32 otherwise (bf16/fp16 are upcast)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def check_num_householder(num_householder: object) -> int:
    if isinstance(num_householder, bool) or not isinstance(num_householder, int) or num_householder < 1:
        raise ValueError(f"num_householder must be an int >= 1, got {num_householder!r}")
    return num_householder


def resolve_scale(scale: object, key_dim: int) -> float:
    """``None`` means the usual 1/sqrt(K); anything else must be a finite real number."""
    if scale is None:
        return key_dim**-0.5
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite float or None (meaning K**-0.5), got {scale!r}")
    return float(scale)


def validate_gated_delta_product_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    *,
    num_householder: int,
    scale: float | None,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
) -> GDPDims:
    """Check every argument of ``gated_delta_product`` and return the call's sizes.

    Values of ``g`` (expected ≤ 0) and ``beta`` (the layer keeps it in (0, 2)) are not checked: that would
    synchronise with the device on every call, and the math is defined for any real values.
    """
    n_h = check_num_householder(num_householder)
    check_tensor("q", q, 4, "[B, T, H, K]")
    check_tensor("k", k, 4, "[B, T*num_householder, H, K]")
    check_tensor("v", v, 4, "[B, T*num_householder, H, V]")
    check_tensor("beta", beta, 3, "[B, T*num_householder, H]")
    if g is not None:
        check_tensor("g", g, 3, "[B, T, H]")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    steps = k.shape[1]
    if steps != T * n_h:
        raise ValueError(
            f"k must have T*num_householder = {T}*{n_h} = {T * n_h} interleaved steps along dim 1 "
            f"(step j of token t at t*num_householder+j), got k of shape {tuple(k.shape)}"
        )
    check_shape("k", k, (B, T * n_h, H, K), "[B, T*num_householder, H, K]")
    check_shape("v", v, (B, T * n_h, H, V), "[B, T*num_householder, H, V]")
    check_shape("beta", beta, (B, T * n_h, H), "[B, T*num_householder, H]")
    if g is not None:
        check_shape("g", g, (B, T, H), "[B, T, H]")
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens)
    check_cu_seqlens(cu_seqlens, B, T)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if initial_state is not None:
        check_tensor("initial_state", initial_state, 4, "[N, H, K, V]", dtypes=STATE_DTYPES)
        check_shape("initial_state", initial_state, (N, H, K, V), "[N, H, K, V]")
    return GDPDims(
        batch=B,
        tokens=T,
        heads=H,
        key_dim=K,
        value_dim=V,
        num_householder=n_h,
        num_sequences=N,
        scale=resolve_scale(scale, K),
        compute_dtype=compute_dtype_of(q, k, v, g, beta, initial_state),
    )
