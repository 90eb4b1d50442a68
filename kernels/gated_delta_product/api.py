"""Entry points called by ``titan_delta.ops.gated_delta_product(..., backend="triton")``: the chunked
training path (``chunk.py``) and the recurrent decode path (``recurrent.py``). Checks read shapes and dtypes
only: ``cu_seqlens`` never reaches the host, so a step launches without a device synchronisation (the public
op validates its values once, eagerly).
"""

from __future__ import annotations

import torch

from titan_delta_kernels._checks import check_same_device, check_shape, check_tensor
from titan_delta_kernels.gated_delta_product._common import (
    MAX_HEAD_DIM,
    MAX_VALUE_DIM,
    NARROW_KEY_MAX_VALUE_DIM,
    chunk_geometry,
)
from titan_delta_kernels.gated_delta_product.chunk import gdp_chunk_fwd
from titan_delta_kernels.gated_delta_product.recurrent import gdp_recurrent_fwd

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# fp32 inputs on a GPU: n_h <= 4 (64-step chunks). At n_h >= 5 the 128-step transform's fp32-grade (tf32x3)
# products need more shared memory than an SM has; tf32 there would be tf32-grade, so the kernels refuse.
MAX_FP32_HOUSEHOLDER = 4
GATE_DTYPES = (*KERNEL_DTYPES, torch.float64)
Tensor = torch.Tensor


def _prepare(q, k, v, g, beta, num_householder, scale, initial_state, cu_seqlens):
    """Shape/dtype checks (no host sync) and contiguous copies; returns the custom ops' arguments."""
    chunk_geometry(num_householder)  # range check with a clear message
    n_h = num_householder
    check_tensor("q", q, 4, "[B, T, H, K]", dtypes=KERNEL_DTYPES)
    check_tensor("k", k, 4, "[B, T*num_householder, H, K]", dtypes=KERNEL_DTYPES)
    check_tensor("v", v, 4, "[B, T*num_householder, H, V]", dtypes=KERNEL_DTYPES)
    check_tensor("beta", beta, 3, "[B, T*num_householder, H]", dtypes=GATE_DTYPES)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if q.is_cuda and q.dtype == torch.float32 and n_h > MAX_FP32_HOUSEHOLDER:
        raise ValueError(f"num_householder={n_h} with float32 inputs: the Triton kernels take float32 only "
                         f"up to n_h = {MAX_FP32_HOUSEHOLDER} (use bf16/fp16 inputs or backend='torch')")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if K > MAX_HEAD_DIM or V > MAX_VALUE_DIM:
        raise ValueError(f"the Triton kernels support K <= {MAX_HEAD_DIM} and V <= {MAX_VALUE_DIM}, "
                         f"got K={K}, V={V}")  # fmt: skip
    check_shape("k", k, (B, T * n_h, H, K), "[B, T*num_householder, H, K]")
    check_shape("v", v, (B, T * n_h, H, V), "[B, T*num_householder, H, V]")
    check_shape("beta", beta, (B, T * n_h, H), "[B, T*num_householder, H]")
    if g is not None:
        check_tensor("g", g, 3, "[B, T, H]", dtypes=GATE_DTYPES)
        check_shape("g", g, (B, T, H), "[B, T, H]")
    if cu_seqlens is not None:
        check_tensor("cu_seqlens", cu_seqlens, 1, "[N+1]", dtypes=(torch.int32, torch.int64))
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size must be 1 (documents packed along T), got {B=}")
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if initial_state is not None:
        check_tensor("initial_state", initial_state, 4, "[N, H, K, V]", dtypes=(torch.float32, torch.float64))
        check_shape("initial_state", initial_state, (N, H, K, V), "[N, H, K, V]")
        initial_state = initial_state.contiguous()
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens)
    scale = K**-0.5 if scale is None else float(scale)
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    g = None if g is None else g.contiguous()
    return q, k, v, g, beta, initial_state, cu_seqlens, num_householder, scale


def gated_delta_product_triton(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, *, num_householder: int,
    scale: float | None = None, initial_state: Tensor | None = None, output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """Chunked Gated DeltaProduct (differentiable in q, k, v, g, β and the initial state).

    Same layout and results as ``titan_delta.ops.gated_delta_product``: o [B,T,H,V] in q's dtype and the
    final state [N,H,K,V] fp32 (or None). n_h in 1..8, K up to 128, V up to 256 (on a GPU V <= 64 unless
    K = 128), any T, varlen via cu_seqlens.
    The kernels and their launch parameters depend on (K, V, n_h, dtype, gate), and the state passes' tiles
    on the number of sequences × heads: ``launch_table.py``.
    """
    args = _prepare(q, k, v, g, beta, num_householder, scale, initial_state, cu_seqlens)
    K, V = q.shape[-1], v.shape[-1]
    if q.is_cuda and K < MAX_HEAD_DIM and V > NARROW_KEY_MAX_VALUE_DIM:
        raise ValueError(f"on a GPU the chunked kernels take V > {NARROW_KEY_MAX_VALUE_DIM} only with K = "
                         f"{MAX_HEAD_DIM}, got K={K}, V={V} (titan_delta.ops.gated_delta_product runs such "
                         f"value heads as {NARROW_KEY_MAX_VALUE_DIM}-column slices)")  # fmt: skip
    o, final_state, *_ = gdp_chunk_fwd(*args)
    return o, (final_state if output_final_state else None)


def gated_delta_product_recurrent_triton(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, *, num_householder: int,
    scale: float | None = None, initial_state: Tensor | None = None, output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """Decode path: same arguments and results as ``gated_delta_product_triton``, token by token, no autograd;
    meant for a few new tokens per sequence on top of a carried ``initial_state`` (T = 1 in generation)."""
    args = _prepare(q, k, v, g, beta, num_householder, scale, initial_state, cu_seqlens)
    o, final_state = gdp_recurrent_fwd(*args)
    return o, (final_state if output_final_state else None)
