"""Validation and preparation of DeltaFormer arguments, shared by the public op and both references."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from titan_delta.ops._checks import check_cu_seqlens, check_same_device, check_shape, check_tensor
from titan_delta.ops.deltaformer.kappa import check_kernel


def validate_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None,
    w: torch.Tensor | None,
    kernel: str,
    cu_seqlens: torch.Tensor | None,
    scale: float | None,
) -> float:
    """Raise a clear error for any malformed argument; return the effective scale (default D**-0.5)."""
    check_tensor("q", q, 4, "[B,T,H,D]")
    check_tensor("k", k, 4, "[B,T,H,D]")
    check_tensor("v", v, 4, "[B,T,H,Dv]")
    if w is not None:
        check_tensor("w", w, 4, "[B,T,H,D]")
    if beta is not None:
        check_tensor("beta", beta, 3, "[B,T,H]")
    check_same_device(q=q, k=k, v=v, beta=beta, w=w, cu_seqlens=cu_seqlens)
    B, T, H, D = q.shape
    check_shape("k", k, (B, T, H, D), "[B,T,H,D] (same as q)")
    check_shape("v", v, (B, T, H, v.shape[-1]), "[B,T,H,Dv] (B,T,H as in q)")
    if w is not None:
        check_shape("w", w, (B, T, H, D), "[B,T,H,D] (same as q)")
    if beta is not None:
        check_shape("beta", beta, (B, T, H), "[B,T,H] (as in q)")
    for name, x in (("k", k), ("v", v), ("w", w)):
        if x is not None and x.dtype != q.dtype:
            raise TypeError(f"{name} must have the same dtype as q ({q.dtype}), got {x.dtype}")
    check_kernel(kernel)
    check_cu_seqlens(cu_seqlens, B, T)
    if scale is None:
        return D**-0.5
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite float (or None for D**-0.5), got {scale!r}")
    return float(scale)


@dataclass(frozen=True)
class DeltaFormerInputs:
    """Validated inputs in the compute dtype, layout [B,T,H,*]; ``beta`` and ``w`` always materialised."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    w: torch.Tensor
    beta: torch.Tensor
    kernel: str
    scale: float
    doc_bounds: list[int] | None  # host copy of cu_seqlens
    out_dtype: torch.dtype

    @property
    def seq_len(self) -> int:
        return self.q.shape[1]

    def doc_start_of_each_token(self) -> list[int]:
        """For every position t, the first position of its document (0 without cu_seqlens)."""
        starts = [0] * self.seq_len
        if self.doc_bounds is not None:
            for lo, hi in zip(self.doc_bounds, self.doc_bounds[1:], strict=False):
                starts[lo:hi] = [lo] * (hi - lo)
        return starts

    def segment_ids(self) -> torch.Tensor | None:
        """Document index of each position as a [T] tensor (None without cu_seqlens), for masks."""
        if self.doc_bounds is None:
            return None
        bounds = torch.tensor(self.doc_bounds[1:], device=self.q.device)
        positions = torch.arange(self.seq_len, device=self.q.device)
        return torch.bucketize(positions, bounds, right=True)


def compute_dtype(q: torch.Tensor, beta: torch.Tensor | None) -> torch.dtype:
    """fp64 when the inputs are fp64 (so gradcheck works), else fp32 — never the low-precision input dtype."""
    if q.dtype == torch.float64 or (beta is not None and beta.dtype == torch.float64):
        return torch.float64
    return torch.float32


def prepare_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None,
    w: torch.Tensor | None,
    kernel: str,
    cu_seqlens: torch.Tensor | None,
    scale: float | None,
) -> DeltaFormerInputs:
    scale = validate_inputs(q, k, v, beta, w, kernel, cu_seqlens, scale)
    dtype = compute_dtype(q, beta)
    beta = torch.ones(q.shape[:3], dtype=dtype, device=q.device) if beta is None else beta.to(dtype)
    return DeltaFormerInputs(
        q=q.to(dtype),
        k=k.to(dtype),
        v=v.to(dtype),
        w=(q if w is None else w).to(dtype),
        beta=beta,
        kernel=kernel,
        scale=scale,
        doc_bounds=None if cu_seqlens is None else [int(b) for b in cu_seqlens.tolist()],
        out_dtype=q.dtype,
    )
