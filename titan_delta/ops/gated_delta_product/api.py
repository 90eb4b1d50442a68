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
    be imported); "auto" the kernel for CUDA tensors when it imports, else the reference.
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
    elif backend == "auto" and q.is_cuda:
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
