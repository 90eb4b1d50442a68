"""The gated RMSNorm's Triton kernels: one forward pass and one backward pass over rows of V values.

A row is one head of one token: x [R, V] contiguous (R = tokens × heads), the gate's row r at
G + (r // H) · G_STRIDE + (r % H) · V (a slice of a wider GEMM output keeps its row stride), dy, dx and
dgate contiguous [R, V]. A program walks TILES tiles of BLOCK_R rows; statistics in fp32. The backward
recomputes 1/rms from x (it reads x anyway) instead of saving it, and writes the weight gradient as one fp32
partial sum per program, summed afterwards (deterministic, no atomics).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rows(first, tile, R, H, G_STRIDE, V: tl.constexpr, BLOCK_R: tl.constexpr):
    """(row indices, row ok, the gate's row offsets) of one tile."""
    rows = first + tile * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < R
    gate_rows = (rows // H).to(tl.int64) * G_STRIDE + (rows % H) * V
    return rows.to(tl.int64), ok, gate_rows


@triton.jit
def gated_rmsnorm_fwd_kernel(
    X, G, W, Y, R, H, G_STRIDE, eps,
    V: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """y = x / rms(x) · w · SiLU(g), rounded once to y's dtype."""
    cols = tl.arange(0, BLOCK_V)
    col_ok = cols < V
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    first = tl.program_id(0) * TILES * BLOCK_R
    for tile in range(TILES):
        rows, ok, gate_rows = _rows(first, tile, R, H, G_STRIDE, V, BLOCK_R)
        mask = ok[:, None] & col_ok[None, :]
        x = tl.load(X + rows[:, None] * V + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + gate_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / V + eps)[:, None]
        y = x * rstd * w * (g * tl.sigmoid(g))
        tl.store(Y + rows[:, None] * V + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def gated_rmsnorm_bwd_kernel(
    DY, X, G, W, DX, DG, DW_PARTIAL, R, H, G_STRIDE, eps,
    V: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """dx, dgate (in x's and the gate's dtypes) and DW_PARTIAL[program] = Σ_rows dy · x̂ · SiLU(g), with
    x̂ = x / rms(x): dx = (d x̂ − x̂ · mean(d x̂ · x̂)) / rms(x), d x̂ = dy · w · SiLU(g)."""
    cols = tl.arange(0, BLOCK_V)
    col_ok = cols < V
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
    first = tl.program_id(0) * TILES * BLOCK_R
    for tile in range(TILES):
        rows, ok, gate_rows = _rows(first, tile, R, H, G_STRIDE, V, BLOCK_R)
        mask = ok[:, None] & col_ok[None, :]
        offsets = rows[:, None] * V + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + gate_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / V + eps)[:, None]
        x_hat = x * rstd
        sig = tl.sigmoid(g)
        silu = g * sig
        dg = dy * x_hat * w * sig * (1.0 + g * (1.0 - sig))
        d_hat = dy * w * silu
        dx = (d_hat - x_hat * (tl.sum(d_hat * x_hat, axis=1) / V)[:, None]) * rstd
        dw += dy * x_hat * silu
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
        tl.store(DG + offsets, dg.to(DG.dtype.element_ty), mask=mask)
    tl.store(DW_PARTIAL + tl.program_id(0).to(tl.int64) * V + cols, tl.sum(dw, axis=0), mask=col_ok)
