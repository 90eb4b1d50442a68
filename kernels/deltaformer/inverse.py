"""Inverses of the unit lower-triangular diagonal blocks, (I − X)⁻¹ with X = −β P_cc, by doubling.

(I − X)⁻¹ = Π_j (I + X^(2^j)): X is nilpotent, so log2(chunk) tensor-core products are exact.
``diag_inverse`` is the separate launch of both backward solves.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E, new_buffer

# Largest row sum of |x| for which the doubling may take fp16 operands: then ‖x^m‖∞ ≤ 1.0625^m and every
# partial product Π (I + x^(2^j)) = Σ_{i<2^k} x^i stays below Σ_{i<64} 1.0625^i ≈ 760 in ∞-norm, far inside
# fp16's range. β ≤ 1 (the models' sigmoid or one) always qualifies: the rows of β·P sum to β at most.
FP16_SAFE_ROW_SUM = tl.constexpr(1.0625)


@triton.jit
def _doubling(x, BT: tl.constexpr, LOG2_BT: tl.constexpr, INV_PREC: tl.constexpr, FP16: tl.constexpr):
    offs = tl.arange(0, BT)
    inv = tl.where(offs[:, None] == offs[None, :], 1.0, 0.0) + x
    power = x
    for _ in tl.static_range(LOG2_BT - 1):
        if FP16:
            half = power.to(tl.float16)
            power = tl.dot(half, half)
            inv = inv + tl.dot(inv.to(tl.float16), power.to(tl.float16))
        else:
            power = tl.dot(power, power, input_precision=INV_PREC)
            inv = inv + tl.dot(inv, power, input_precision=INV_PREC)
    return inv


@triton.jit
def store_unit_lower_inverse(BASE, SCALE, x, BT: tl.constexpr, LOG2_BT: tl.constexpr, INV_PREC: tl.constexpr):
    """Store (I − x)⁻¹ of a strictly lower-triangular BT×BT x row-major at BASE (other threads' loads need a
    barrier); into an fp16 buffer divided by a power of two (stored at SCALE) that keeps its entries under
    2^15 (``inverse_buffers``). Under ``tf32`` the products take fp16 operands when the rows of |x| sum to at
    most FP16_SAFE_ROW_SUM: fp16 keeps tf32's 11 significant bits (and, below 2^-14, an absolute error under
    2^-25) at twice the rate and half the shared-memory bytes."""
    offs = tl.arange(0, BT)
    ptrs = BASE + offs[:, None] * BT + offs[None, :]
    if INV_PREC == "tf32":
        if tl.max(tl.sum(tl.abs(x), 1), 0) <= FP16_SAFE_ROW_SUM:
            inv = _doubling(x, BT, LOG2_BT, INV_PREC, True)
        else:
            inv = _doubling(x, BT, LOG2_BT, INV_PREC, False)
    else:
        inv = _doubling(x, BT, LOG2_BT, INV_PREC, False)
    if BASE.dtype.element_ty == tl.float16:
        largest = tl.max(tl.max(tl.abs(inv), 1), 0)
        factor = tl.where(largest > 32768.0, tl.exp2(tl.ceil(tl.log2(largest)) - 15.0), 1.0)
        tl.store(SCALE, factor)
        inv = inv / factor
    tl.store(ptrs, inv.to(BASE.dtype.element_ty))


@triton.jit
def load_unit_lower_inverse(BASE, SCALE, BT: tl.constexpr):
    """The inverse ``store_unit_lower_inverse`` left at BASE, as stored, and the factor its products take."""
    offs = tl.arange(0, BT)
    return tl.load(BASE + offs[:, None] * BT + offs[None, :]), tl.load(SCALE)


def inverse_buffers(
    programs: int, n_chunks: int, chunk: int, input_dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """[programs, n_chunks, chunk, chunk] inverses and an fp32 [programs, n_chunks] factor each. 16-bit
    inputs: fp16, which keeps the 11 significant bits their tf32 products round the inverses to (half the
    bytes to write and read), scaled by a power of two where an entry would pass 2^15 (β > 1 can make
    them grow geometrically); fp32 inputs: fp32, factors one."""
    if input_dtype == torch.float32:
        linv = new_buffer((programs, n_chunks, chunk, chunk), device=device, dtype=torch.float32)
        return linv, torch.ones((programs, n_chunks), device=device, dtype=torch.float32)
    linv = new_buffer((programs, n_chunks, chunk, chunk), device=device, dtype=torch.float16)
    return linv, new_buffer((programs, n_chunks), device=device, dtype=torch.float32)


@triton.jit
def _diag_inverse_kernel(
    W, K, BETA, LSE, LINV, SCALES, DOC_START, T, H, n_chunks, qk_scale,
    D: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr, LOG2_BT: tl.constexpr,
    VARLEN: tl.constexpr, DOT_PREC: tl.constexpr, INV_PREC: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs = tl.arange(0, BT)
    rows = pid_c * BT + offs
    row_ok = rows < T
    offs_d = tl.arange(0, BD)
    d_ok = offs_d < D
    ptrs = ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :]
    w = tl.load(W + ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k = tl.load(K + ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
    beta = tl.load(BETA + (b * T + rows) * H + h, mask=row_ok, other=0.0).to(tl.float32)
    s = tl.dot(w, tl.trans(k), input_precision=DOT_PREC) * qk_scale
    allowed = (rows[None, :] < rows[:, None]) & row_ok[:, None]
    if VARLEN:
        row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
        allowed = allowed & (rows[None, :] >= row_doc[:, None])
    x = -tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0) * beta[:, None]
    index = pid_bh * n_chunks + pid_c
    store_unit_lower_inverse(LINV + index * BT * BT, SCALES + index, x, BT, LOG2_BT, INV_PREC)


def diag_inverse(
    w: torch.Tensor, k: torch.Tensor, beta: torch.Tensor, lse: torch.Tensor, doc_start: torch.Tensor | None,
    *, scale: float, chunk: int, dot_prec: str, inv_prec: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverses of every diagonal block and their factors (``inverse_buffers``), one program per
    (chunk, b, h); 4 warps, one warp group per chunk×chunk tile (8 were slower)."""
    B, T, H, D = w.shape
    n_chunks = cdiv(T, chunk)
    linv, scales = inverse_buffers(B * H, n_chunks, chunk, w.dtype, w.device)
    launch(
        _diag_inverse_kernel, (n_chunks, B * H),
        w, k, beta, lse, linv, scales, doc_start if doc_start is not None else lse, T, H, n_chunks,
        scale * LOG2_E,
        D=D, BD=next_power_of_2(D), BT=chunk, LOG2_BT=chunk.bit_length() - 1, VARLEN=doc_start is not None,
        DOT_PREC=dot_prec, INV_PREC=inv_prec, num_warps=4,
    )
    return linv, scales
