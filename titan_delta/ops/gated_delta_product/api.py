"""The public Gated DeltaProduct op: validates once, then runs the Triton kernel or the PyTorch reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from titan_delta.ops._checks import check_backend, reference_precision
from titan_delta.ops.gated_delta_product._validate import validate_gated_delta_product_args
from titan_delta.ops.gated_delta_product.chunked import gated_delta_product_chunked


def _load_triton_kernel():
    """The kernel is imported lazily: the op must work where Triton or its kernels are unavailable."""
    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    return gated_delta_product_triton


# Where "auto" takes the kernel: the head sizes its H200 correctness runs covered (docs/benchmarks.md) and the
# n_h range it compiles for. Anything else runs the reference rather than an unverified or refused launch.
AUTO_KERNEL_HEAD_DIMS = (64, 128)
AUTO_KERNEL_VALUE_DIMS = (64, 128, 256)  # with K = 128: the kernels tile V, one launch covers the value head
AUTO_NARROW_KEY_VALUE_DIMS = (64,)  # with K = 64 wider value heads failed the GPU tests (the kernel refuses)
AUTO_KERNEL_MAX_HOUSEHOLDER = 8
MAX_FP32_HOUSEHOLDER = 4  # the kernels' fp32 limit (titan_delta_kernels.gated_delta_product.api)
# Wider value heads run as V / piece kernel launches: every value column of the state evolves independently
# given k, β and g, so splitting V is exact (each piece repeats the K-side work).
MAX_VALUE_DIM = 1024


def value_piece(v_dim: int, k_dim: int = 128) -> int | None:
    """The value-head slice the kernel runs on for key dim ``k_dim``: V itself when supported, else the widest
    supported width dividing V (256, 128 or 64 at K = 128; 64 at K = 64)."""
    widths = AUTO_KERNEL_VALUE_DIMS if k_dim == max(AUTO_KERNEL_HEAD_DIMS) else AUTO_NARROW_KEY_VALUE_DIMS
    if v_dim in widths:
        return v_dim
    for piece in sorted(widths, reverse=True):
        if v_dim % piece == 0 and v_dim <= MAX_VALUE_DIM:
            return piece
    return None


def _auto_prefers_triton(q: torch.Tensor, v: torch.Tensor, num_householder: int) -> bool:
    return (
        q.is_cuda
        and q.dtype != torch.float64
        and q.shape[-1] in AUTO_KERNEL_HEAD_DIMS
        and value_piece(v.shape[-1], q.shape[-1]) is not None
        and num_householder <= AUTO_KERNEL_MAX_HOUSEHOLDER
        and (q.dtype != torch.float32 or num_householder <= MAX_FP32_HOUSEHOLDER)
    )


def run_in_value_pieces(
    op: Callable[..., tuple[torch.Tensor, torch.Tensor | None]],
    piece: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``op`` over slices of ``piece`` value columns, outputs and final states concatenated along V.
    Autograd sums the slices' gradients for the shared q, k, g and β."""
    v_dim = v.shape[-1]
    if v_dim == piece:
        return op(q, k, v, g, beta, initial_state=initial_state, **kwargs)
    outputs, states = [], []
    for start in range(0, v_dim, piece):
        h0 = None if initial_state is None else initial_state[..., start : start + piece]
        o, state = op(q, k, v[..., start : start + piece], g, beta, initial_state=h0, **kwargs)
        outputs.append(o)
        states.append(state)
    final = None if states[0] is None else torch.cat(states, dim=-1)
    return torch.cat(outputs, dim=-1), final


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
    be imported); "auto" the kernel for non-fp64 CUDA tensors with K in {64, 128}, V in {64, 128} or a
    multiple of 64 up to 1024 (run as 128- or 64-wide value slices) and n_h <= 8 when it imports, else the
    reference.
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
        piece = value_piece(v.shape[-1], q.shape[-1]) if q.is_cuda else None
        return run_in_value_pieces(kernel, piece or v.shape[-1], q, k, v, g, beta, **kwargs)
    with reference_precision(q):
        return gated_delta_product_chunked(q, k, v, g, beta, **kwargs)
