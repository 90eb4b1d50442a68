"""The public DeltaFormer op: validates its arguments, then runs the Triton kernel or the torch reference."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from titan_delta.ops._checks import check_backend, reference_precision
from titan_delta.ops.deltaformer.chunked import deltaformer_attn_chunked
from titan_delta.ops.deltaformer.inputs import compute_dtype, validate_inputs

TRITON_KERNELS = ("softmax",)  # κ1 variants the Triton kernel implements; the rest run on the reference


def _import_triton_kernel() -> Callable[..., torch.Tensor]:
    """Imported lazily: the kernels package (and Triton) need not be importable for the torch backend."""
    from titan_delta_kernels.deltaformer import deltaformer_attn_triton

    return deltaformer_attn_triton


def _triton_can_run(device: torch.device) -> bool:
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


TRITON_HEAD_DIMS = (16, 128)  # inclusive range of D and Dv the kernel takes; "auto" runs others on torch


def _auto_prefers_triton(q: torch.Tensor, v: torch.Tensor, beta: torch.Tensor | None, kernel: str) -> bool:
    """The kernel runs softmax κ1 on CUDA for head dims in its range; fp64 (gradcheck) keeps the reference."""
    low, high = TRITON_HEAD_DIMS
    return (
        kernel in TRITON_KERNELS
        and q.device.type == "cuda"
        and compute_dtype(q, beta) != torch.float64
        and low <= q.shape[-1] <= high
        and low <= v.shape[-1] <= high
    )


def deltaformer_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None = None,
    *,
    w: torch.Tensor | None = None,
    kernel: str = "softmax",
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """DeltaFormer attention (Xu et al., NeurIPS 2025).

    Stage 1: u_t = v_t − β_t Σ_{i<t} κ1(w_t, k_i) u_i (u_t = v_t when nothing precedes t in its document).
    Stage 2: o_t = Σ_{i≤t} softmax_i(scale · q_t·k_i) u_i.
    κ1 (``kernel``) is one of "softmax" (normalised over i < t), "linear", "relu", "round" (two decimals;
    zero gradient through the rounding) or "exp" (unnormalised), always applied to the scaled score
    scale · w_t·k_i.

    Args:
        q, k: [B,T,H,D]. v: [B,T,H,Dv]; Dv may differ from D.
        beta: [B,T,H] step sizes; None means all ones.
        w: [B,T,H,D] stage-1 query; None means w = q (pass w=k for the paper's listing).
        cu_seqlens: int32/int64 [N+1] document boundaries of sequences packed along T (B must be 1);
            no term of either stage crosses a boundary.
        scale: score scale, default D**-0.5.
        backend: "torch" (chunk-wise reference), "triton" (the kernel, κ1 = softmax only; on CPU only
            with TRITON_INTERPRET=1), or "auto" (the kernel for softmax on CUDA when it imports, the
            inputs are not fp64 and 16 <= D, Dv <= 128; else torch).

    Returns:
        o: [B,T,H,Dv] in q's dtype. The math runs in fp32 (fp64 for fp64 inputs).
    """
    check_backend(backend)
    scale = validate_inputs(q, k, v, beta, w, kernel, cu_seqlens, scale)
    triton_kernel = None
    if backend == "triton":
        if kernel not in TRITON_KERNELS:
            raise ValueError(
                f"backend='triton' supports kernel in {TRITON_KERNELS}, got kernel={kernel!r}; "
                "use backend='torch' or 'auto' for the other κ1 variants"
            )
        if not _triton_can_run(q.device):
            raise RuntimeError(
                f"backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU), got q on {q.device}"
            )
        try:
            triton_kernel = _import_triton_kernel()
        except (ImportError, AttributeError) as err:
            raise RuntimeError(
                f"backend='triton' requested but titan_delta_kernels.deltaformer.deltaformer_attn_triton "
                f"is not importable: {err}"
            ) from err
    elif backend == "auto" and _auto_prefers_triton(q, v, beta, kernel):
        try:
            triton_kernel = _import_triton_kernel()
        except (ImportError, AttributeError):
            triton_kernel = None

    if triton_kernel is None:
        with reference_precision(q):
            return deltaformer_attn_chunked(
                q, k, v, beta, w=w, kernel=kernel, cu_seqlens=cu_seqlens, scale=scale
            )
    if beta is None:
        beta = torch.ones(q.shape[:3], dtype=q.dtype, device=q.device)
    return triton_kernel(q, k, v, beta, w=w, scale=scale, cu_seqlens=cu_seqlens)
