"""Helpers shared by the DeltaFormer kernels: dot precisions, document tables, output buffers.

Every kernel works on the flattened [B, T, H, *] layout (contiguous), one (b, h) pair per program column.
Packed documents (``cu_seqlens``) reach the kernels as two int32 [T] tables built on the device,
``doc_start[t]`` and ``doc_end[t]``, so no launch ever reads ``cu_seqlens`` on the host.
"""

from __future__ import annotations

import os

import torch

LOG2_E = 1.4426950408889634  # scores run through exp2, so the scale carries log2(e)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs: ``tf32x3`` (three tf32 products on the tensor cores, fp32-grade). ``ieee`` would be
    exact too, but it compiles to FMA loops unrolled over whole tiles, which takes minutes at the masked
    128-wide tiles of D = 96. bf16/fp16 operands are exact in fp32 accumulation whatever the setting."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


def inverse_precision(dtype: torch.dtype) -> str:
    """Precision of the fp32 products of the diagonal-block inverses and their application.

    bf16/fp16 inputs: plain tf32 gives the same errors as tf32x3 at a third of the cost (the inverse
    entries are bounded by 1: β P is row-substochastic for β ≤ 1). The interpreter keeps every product
    in fp32 (it never takes the fp16-operand doubling of ``inverse.unit_lower_inverse``)."""
    if dtype == torch.float32:
        return "tf32x3"
    return "ieee" if interpreting() else "tf32"


def register_cap(max_registers: int) -> dict[str, int]:
    """Launch options for a register cap (Triton's ``maxnreg``): none under the interpreter."""
    return {"maxnreg": max_registers} if max_registers and not interpreting() else {}


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
    """torch.empty, except under TITAN_DELTA_POISON=1 (tests) where it is NaN-filled, so any element a
    kernel forgets to write shows up in the comparison with the reference."""
    out = torch.empty(tuple(shape), device=device, dtype=dtype)
    if os.environ.get("TITAN_DELTA_POISON") == "1":
        out.fill_(float("nan"))
    return out
