"""The gated RMSNorm as ``torch.library`` custom ops around its Triton kernels (kernels.py).

y = x / rms(x) · weight · SiLU(gate) over the last dimension (one head of V values), as
``titan_delta.models.components.norms.GatedRMSNorm`` computes it in PyTorch (its reference and CPU path):
fp32 statistics, one rounding to x's dtype. Gated DeltaProduct takes the gate from a GEMM shared with β and
the decay, so the gate arrives as a strided slice; the kernels read it in place. The backward computes dx
and dgate in one pass; under torch.compile inductor otherwise fused the gate's gradient with β's, the
decay's and their concatenation into one pointwise kernel over the whole GEMM output, beside a second
kernel for dx, each reading dy, x and the gate.
"""

from __future__ import annotations

import os

import torch

from titan_delta_kernels._checks import check_same_device, check_tensor
from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.gated_rmsnorm.kernels import gated_rmsnorm_bwd_kernel, gated_rmsnorm_fwd_kernel

Tensor = torch.Tensor

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_WIDTH = 1024  # one row tile holds a whole row
TILES = 8  # row tiles per program (the backward's weight-gradient partials: one per program)
FORWARD_VALUES = 2048  # values per row tile: 16 per thread on 4 warps
BACKWARD_VALUES = 1024  # the backward keeps more fp32 temporaries per value
NUM_WARPS = 4


def _launch_args(x: Tensor, gate: Tensor, values_per_tile: int) -> tuple[tuple[int, ...], dict, Tensor, int]:
    """(grid, constexprs, the gate as the kernels read it, the gate's row stride) for x [N, H, V]."""
    N, H, V = x.shape
    if gate.stride(-1) != 1 or gate.stride(-2) != V:
        gate = gate.contiguous()
    block_v = next_power_of_2(V)
    block_r = max(1, values_per_tile // block_v)
    grid = (cdiv(N * H, block_r * TILES),)
    kw = dict(V=V, BLOCK_V=block_v, BLOCK_R=block_r, TILES=TILES, num_warps=NUM_WARPS)
    return grid, kw, gate, gate.stride(0)


def _empty(shape, like: Tensor, dtype: torch.dtype) -> Tensor:
    """torch.empty, NaN-filled under TITAN_DELTA_POISON=1 (tests) so that unwritten elements show."""
    out = torch.empty(shape, device=like.device, dtype=dtype)
    return out.fill_(float("nan")) if os.environ.get("TITAN_DELTA_POISON") == "1" else out


@torch.library.custom_op("titan_delta::gated_rmsnorm_fwd", mutates_args=())
def gated_rmsnorm_fwd(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """y [N, H, V] (contiguous, x's dtype) from x [N, H, V], gate [N, H, V] (heads of a row contiguous)."""
    x = x.contiguous()
    y = _empty(x.shape, x, x.dtype)
    if y.numel() == 0:
        return y
    grid, kw, gate, gate_stride = _launch_args(x, gate, FORWARD_VALUES)
    N, H, _ = x.shape
    launch(gated_rmsnorm_fwd_kernel, grid, x, gate, weight.contiguous(), y, N * H, H, gate_stride, eps, **kw)
    return y


@gated_rmsnorm_fwd.register_fake
def _(x, gate, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("titan_delta::gated_rmsnorm_bwd", mutates_args=())
def gated_rmsnorm_bwd(
    dy: Tensor, x: Tensor, gate: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx in x's dtype, dgate in the gate's dtype, dweight in the weight's), contiguous."""
    x, dy = x.contiguous(), dy.contiguous()
    dx = _empty(x.shape, x, x.dtype)
    dgate = _empty(x.shape, x, gate.dtype)
    if dx.numel() == 0:
        return dx, dgate, torch.zeros_like(weight)
    grid, kw, gate, gate_stride = _launch_args(x, gate, BACKWARD_VALUES)
    N, H, V = x.shape
    partial = _empty((grid[0], V), x, torch.float32)
    launch(gated_rmsnorm_bwd_kernel, grid, dy, x, gate, weight.contiguous(), dx, dgate, partial, N * H, H,
           gate_stride, eps, **kw)  # fmt: skip
    return dx, dgate, partial.sum(0).to(weight.dtype)


@gated_rmsnorm_bwd.register_fake
def _(dy, x, gate, weight, eps):
    contiguous = torch.contiguous_format
    return (torch.empty_like(x, memory_format=contiguous), torch.empty_like(x, dtype=gate.dtype,
            memory_format=contiguous), torch.empty_like(weight))  # fmt: skip


def _setup_context(ctx, inputs, output) -> None:
    x, gate, weight, eps = inputs
    ctx.save_for_backward(x, gate, weight)
    ctx.eps = eps


def _backward(ctx, dy):
    x, gate, weight = ctx.saved_tensors
    dx, dgate, dweight = gated_rmsnorm_bwd(dy, x, gate, weight, ctx.eps)
    return dx, dgate, dweight, None


torch.library.register_autograd("titan_delta::gated_rmsnorm_fwd", _backward, setup_context=_setup_context)


def gated_rmsnorm(x: Tensor, gate: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """x / rms(x) · weight · SiLU(gate) over the last dimension (V ≤ 1024), statistics in fp32, y in x's
    dtype. x and gate [..., H, V] of one shape (the gate may be a strided view whose heads of a row are
    contiguous; it is read in place), weight [V]; fp32, bf16 or fp16. Differentiable in all three. Runs on
    CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (tests)."""
    check_tensor("x", x, x.dim(), "[..., H, V]", dtypes=KERNEL_DTYPES)
    if x.dim() < 2 or x.shape[-1] > MAX_WIDTH:
        raise ValueError(f"x must have shape [..., H, V] with V <= {MAX_WIDTH}, got {tuple(x.shape)}")
    check_tensor("gate", gate, x.dim(), "[..., H, V] like x", dtypes=KERNEL_DTYPES)
    if gate.shape != x.shape:
        raise ValueError(f"gate must have x's shape {tuple(x.shape)}, got {tuple(gate.shape)}")
    check_tensor("weight", weight, 1, "[V]", dtypes=KERNEL_DTYPES)
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape [V] = [{x.shape[-1]}], got {tuple(weight.shape)}")
    check_same_device(x=x, gate=gate, weight=weight)
    H, V = x.shape[-2:]
    y = gated_rmsnorm_fwd(x.reshape(-1, H, V), gate.reshape(-1, H, V), weight, float(eps))
    return y.view(x.shape)
