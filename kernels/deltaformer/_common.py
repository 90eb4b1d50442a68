"""Helpers shared by the DeltaFormer kernels: dot precisions, document tables, output buffers, tile pointers.

Kernels work on the contiguous [B, T, H, *] layout; packed documents reach them as int32 [T] tables built on
the device (``doc_start[t]``, ``doc_end[t]``), so no launch reads ``cu_seqlens`` on the host.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2_E = 1.4426950408889634  # scores run through exp2, so the scale carries log2(e)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs: ``tf32x3`` (three tf32 products on the tensor cores, fp32-grade); ``ieee`` is exact too
    but compiles to FMA loops unrolled over whole tiles. bf16/fp16 operands are exact whatever the setting."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


def inverse_precision(dtype: torch.dtype) -> str:
    """Products of the diagonal-block inverses: bf16/fp16 inputs take plain tf32, as accurate as tf32x3 for
    entries bounded by 1 (β ≤ 1); the interpreter computes every product in fp32."""
    if dtype == torch.float32:
        return "tf32x3"
    return "ieee" if interpreting() else "tf32"


def precisions(dtype: torch.dtype) -> dict[str, str]:
    """The DOT_PREC and INV_PREC launch keywords of the kernels that build or apply the inverses."""
    return {"DOT_PREC": dot_precision(dtype), "INV_PREC": inverse_precision(dtype)}


def document_tables(cu_seqlens: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [T] first position and one-past-last position of each token's document, on the device."""
    bounds = cu_seqlens.to(torch.int64)
    positions = torch.arange(seq_len, device=bounds.device, dtype=torch.int64)
    doc = torch.searchsorted(bounds[1:], positions, right=True)
    doc_start = bounds[doc].to(torch.int32)
    doc_end = bounds[(doc + 1).clamp_max(bounds.numel() - 1)].to(torch.int32)
    return doc_start.contiguous(), doc_end.contiguous()


def new_buffer(
    shape: tuple[int, ...] | torch.Size, *, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """torch.empty, NaN-filled under TITAN_DELTA_POISON=1 (tests) so that unwritten elements show."""
    out = torch.empty(tuple(shape), device=device, dtype=dtype)
    if os.environ.get("TITAN_DELTA_POISON") == "1":
        out.fill_(float("nan"))
    return out


@triton.jit
def tile_ptrs(BASE, t, b, h, T, H, N: tl.constexpr, offs):
    """Pointers to positions t (a vector) of (b, h), columns offs, of a contiguous [B, T, H, N] tensor."""
    return BASE + ((b * T + t) * H + h)[:, None] * N + offs[None, :]


@triton.jit
def load_tile(BASE, t, t_ok, b, h, T, H, N: tl.constexpr, offs, n_ok):
    """The ``tile_ptrs`` tile, zero outside rows t_ok and columns n_ok."""
    return tl.load(tile_ptrs(BASE, t, b, h, T, H, N, offs), mask=t_ok[:, None] & n_ok[None, :], other=0.0)
