"""The public Gated DeltaProduct op: validates once, then runs the Triton kernel or the PyTorch reference."""

from __future__ import annotations

import torch

from titan_delta.ops._checks import check_backend
from titan_delta.ops.gated_delta_product._validate import validate_gated_delta_product_args
from titan_delta.ops.gated_delta_product.chunked import gated_delta_product_chunked


def _load_triton_kernel():
    """The kernel is imported lazily: the op must work where Triton or its kernels are unavailable."""
    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    return gated_delta_product_triton


# Where "auto" takes the kernel: the head sizes its H200 correctness runs covered (docs/benchmarks.md) and the
# n_h range it compiles for. Anything else runs the reference rather than an unverified or refused launch.
AUTO_KERNEL_HEAD_DIMS = (64, 128)
AUTO_KERNEL_MAX_HOUSEHOLDER = 8


def _auto_prefers_triton(q: torch.Tensor, v: torch.Tensor, num_householder: int) -> bool:
    return (
        q.is_cuda
        and q.dtype != torch.float64
        and q.shape[-1] in AUTO_KERNEL_HEAD_DIMS
        and v.shape[-1] in AUTO_KERNEL_HEAD_DIMS
        and num_householder <= AUTO_KERNEL_MAX_HOUSEHOLDER
    )


def gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    *,
    num_householder: int,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaProduct (Siems et al.): per token S ← e^{g_t} S, then for j < n_h
    S ← S + β_{t,j} k_{t,j} (v_{t,j} − Sᵀ k_{t,j})ᵀ, and o_t = Sᵀ (q_t · scale) after the last step.

    Layout (as in flash-linear-attention): q [B,T,H,K]; k [B,T·n_h,H,K], v [B,T·n_h,H,V] and
    beta [B,T·n_h,H] interleaved (step j of token t at t·n_h + j); g [B,T,H] log forget gate (≤ 0) or None.
    ``scale`` defaults to K**-0.5. ``initial_state`` [N,H,K,V] fp32 (fp64 allowed) where N = B, or the number
    of documents when ``cu_seqlens`` (int32/int64 [N+1], in tokens, B = 1) packs them along T.
    Returns o [B,T,H,V] in q's dtype and the final state [N,H,K,V] (fp32; fp64 for fp64 inputs) or None.

    ``backend``: "torch" runs the chunked PyTorch reference; "triton" the Triton kernel (error if it cannot
    be imported); "auto" the kernel for non-fp64 CUDA tensors with K, V in {64, 128} and n_h <= 8 when it
    imports, else the reference.
    """
    check_backend(backend)
    dims = validate_gated_delta_product_args(
        q,
        k,
        v,
        g,
        beta,
        num_householder=num_householder,
        scale=scale,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    kernel = None
    if backend == "triton":
        try:
            kernel = _load_triton_kernel()
        except (ImportError, AttributeError) as err:
            raise RuntimeError(
                "backend='triton' needs titan_delta_kernels.gated_delta_product.gated_delta_product_triton, "
                f"which could not be imported ({err}); use backend='torch' or 'auto'"
            ) from err
    elif backend == "auto" and _auto_prefers_triton(q, v, num_householder):
        try:
            kernel = _load_triton_kernel()
        except (ImportError, AttributeError):
            kernel = None
    kwargs = dict(
        num_householder=num_householder,
        scale=dims.scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )
    if kernel is not None:
        return kernel(q, k, v, g, beta, **kwargs)
    return gated_delta_product_chunked(q, k, v, g, beta, **kwargs)
