"""Inverses of the unit lower-triangular diagonal chunk blocks, (I − X)⁻¹ with X = −β P_cc.

Two ways, same result up to rounding:
  * doubling, (I − X)⁻¹ = Π_j (I + X^(2^j)): X is nilpotent, so log2(chunk) factors are exact. Every step
    is a tensor-core product, but they are chunk×chunk×chunk and form one dependent chain — ten 64³
    products per chunk at chunk = 64 (the default: on an H200 the blocks below did not make the forward
    measurably faster, docs/kernels_deltaformer.md, fifth session);
  * blocks (variant ``invsplit=N``): the chunk is cut into N×N blocks of S = chunk / N rows. The diagonal
    blocks are inverted by doubling at size S (independent of each other), then block forward substitution
    fills the rest: Z_ij = Z_ii Σ_{j≤m<i} X_im Z_mj. At chunk = 64 that is 2.25 (N = 2) or 0.6 (N = 4)
    64³-equivalents instead of 10. Blocks are exchanged through the output buffer itself (the caller
    parks the inverse in global memory anyway), so no register slicing is needed; a barrier separates
    the writes of one block row from the reads of the next.
"""

from __future__ import annotations

import triton
import triton.language as tl

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
def unit_lower_inverse(x, BT: tl.constexpr, LOG2_BT: tl.constexpr, INV_PREC: tl.constexpr):
    """(I − x)⁻¹ for a strictly lower-triangular BT×BT x, as Π_j (I + x^(2^j)): x is nilpotent, so
    LOG2_BT factors (LOG2_BT − 1 squarings) are exact; every step is a tensor-core product.

    Under ``tf32`` the products take fp16 operands when the rows of |x| sum to at most FP16_SAFE_ROW_SUM:
    fp16 keeps tf32's 11 significant bits (and, below 2^-14, an absolute error under 2^-25), at twice
    the rate and half the shared-memory bytes per operand; on an H200 this cut the small benchmark
    forward's preparation launches from 285 to 242 µs (docs/benchmarks.md, sixth session). Other blocks
    (β > 1) keep tf32 operands."""
    if INV_PREC == "tf32":
        if tl.max(tl.sum(tl.abs(x), 1), 0) <= FP16_SAFE_ROW_SUM:
            inv = _doubling(x, BT, LOG2_BT, INV_PREC, True)
        else:
            inv = _doubling(x, BT, LOG2_BT, INV_PREC, False)
    else:
        inv = _doubling(x, BT, LOG2_BT, INV_PREC, False)
    return inv


@triton.jit
def _block_ptrs(BASE, i, j, S: tl.constexpr, BT: tl.constexpr):
    """Pointers of block (i, j), S×S, of a row-major BT×BT matrix at BASE."""
    offs = tl.arange(0, S)
    return BASE + (i * S + offs)[:, None] * BT + (j * S + offs)[None, :]


@triton.jit
def _invert_blocks_in_place(BASE, BT: tl.constexpr, S: tl.constexpr, LOG2_S: tl.constexpr,
                            SPLIT: tl.constexpr, INV_PREC: tl.constexpr):
    """BASE holds a strictly lower-triangular X (fp32, BT×BT, row-major); afterwards it holds (I − X)⁻¹.

    Block row i overwrites X_ij with Z_ij for j = 0, 1, ... in that order: Z_ij reads X_im only for m ≥ j,
    so no block is read after it was overwritten; the blocks above the diagonal stay zero."""
    for i in tl.static_range(SPLIT):
        diag = _block_ptrs(BASE, i, i, S, BT)
        tl.store(diag, unit_lower_inverse(tl.load(diag), S, LOG2_S, INV_PREC))
    tl.debug_barrier()  # block rows below read these diagonal inverses (stored by other threads)
    for i in tl.static_range(1, SPLIT):
        z_ii = tl.load(_block_ptrs(BASE, i, i, S, BT))
        for j in tl.static_range(i):
            acc = tl.zeros([S, S], dtype=tl.float32)
            for m in tl.static_range(j, i):
                x_im = tl.load(_block_ptrs(BASE, i, m, S, BT))
                z_mj = tl.load(_block_ptrs(BASE, m, j, S, BT))
                acc += tl.dot(x_im, z_mj, input_precision=INV_PREC)
            tl.store(_block_ptrs(BASE, i, j, S, BT), tl.dot(z_ii, acc, input_precision=INV_PREC))
        tl.debug_barrier()  # the next block row reads this one


@triton.jit
def store_unit_lower_inverse(BASE, x, BT: tl.constexpr, LOG2_BT: tl.constexpr, LOG2_SPLIT: tl.constexpr,
                             INV_PREC: tl.constexpr):
    """Store (I − x)⁻¹ (x strictly lower-triangular, fp32 BT×BT in registers) row-major at BASE: by
    doubling when LOG2_SPLIT = 0, else blockwise with 2^LOG2_SPLIT block rows (module docstring). Loads
    of the result by other threads of the program need a barrier first, as after any store."""
    offs = tl.arange(0, BT)
    ptrs = BASE + offs[:, None] * BT + offs[None, :]
    if LOG2_SPLIT == 0:
        tl.store(ptrs, unit_lower_inverse(x, BT, LOG2_BT, INV_PREC))
    else:
        tl.store(ptrs, x)
        tl.debug_barrier()
        _invert_blocks_in_place(BASE, BT, BT >> LOG2_SPLIT, LOG2_BT - LOG2_SPLIT, 1 << LOG2_SPLIT, INV_PREC)


def log2_split(chunk: int, split: int) -> int:
    """LOG2_SPLIT for a chunk cut into ``split`` block rows; blocks must be ≥ 16 rows (tensor-core dots)."""
    if split < 1 or split & (split - 1) or chunk // split < 16:
        raise ValueError(f"inverse split must be a power of two leaving blocks of >= 16 rows; chunk={chunk}, "
                         f"split={split}")
    return split.bit_length() - 1
