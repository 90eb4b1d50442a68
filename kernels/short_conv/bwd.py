"""The short conv's backward kernel: the pre-activation's gradient dpre, from it dx and the weight
gradient's partial sums, in one pass over x and dy.

Each program walks its rows one at a time, one warp over a block of channels (a whole head when the rows are
L2-normalised, so a row's norm is a reduction within the warp). dpre[r] needs x[r − j] for j < K and dx[r]
needs dpre[r + s] for s < K: both are sliding windows along the rows, carried in registers from one row to
the next, so a program reads each row once and dpre never goes to memory. A row's dpre adds its K taps to
the dx of the K rows ending at it; the oldest of them is then complete and stored. The program also reads
the K − 1 rows before its first (x only) and computes dpre again for the K − 1 rows after its last (the
next program's), for its last rows' dx.
"""

from __future__ import annotations

import triton
import triton.language as tl

from titan_delta_kernels.short_conv.tiles import L2_EPS, inverse_norm, positions


@triton.jit
def _row(TENSOR, r, cols, col_ok, stride, N):
    """Row r of an [N, ·] tensor (rows ``stride`` apart) over ``cols`` in fp32; zero outside [0, N)."""
    inside = (tl.zeros_like(cols) + r >= 0) & (tl.zeros_like(cols) + r < N)
    return tl.load(TENSOR + r.to(tl.int64) * stride + cols, mask=col_ok & inside, other=0.0).to(tl.float32)


@triton.jit
def _row_position(SEQ_POS, r, T, N, HAS_SEQ_POS: tl.constexpr):
    """How many rows back a tap may reach from row r (tiles.py): a scalar for the whole row."""
    return positions(SEQ_POS, r, r % T, (r >= 0) & (r < N), HAS_SEQ_POS)


@triton.jit
def _tap(W, cols, col_ok, K: tl.constexpr, j: tl.constexpr, X_DTYPE: tl.constexpr):
    """The weight of tap j (x[r − j]) over the channels, rounded to x's dtype as the PyTorch path does."""
    return tl.load(W + cols * K + (K - 1 - j), mask=col_ok, other=0.0).to(X_DTYPE).to(tl.float32)


@triton.jit
def _reach(value, pos, s: tl.constexpr):
    """``value`` where tap s is used at a row of position ``pos``, else zero."""
    return tl.where(pos >= s, value, 0.0)


@triton.jit
def _output_to_pre(grad, pre, ACTIVATION: tl.constexpr, NORM: tl.constexpr):
    """The gradient of one row's pre-activation from the gradient of the op's output, through L2 normalisation
    (NORM: u / max(‖u‖, eps) over the row's channels, the norm's gradient zero where eps won) and SiLU
    (ACTIVATION), all in fp32."""
    if ACTIVATION:
        sig = tl.sigmoid(pre)
        u = pre * sig
    else:
        u = pre
    if NORM:
        norm = tl.sqrt(tl.sum(u * u, axis=0))
        inv = inverse_norm(norm)
        y = u * inv
        along_y = tl.where(norm >= L2_EPS, tl.sum(y * grad, axis=0), 0.0)
        grad = (grad - y * along_y) * inv
    if ACTIVATION:
        grad = grad * sig * (1.0 + pre * (1.0 - sig))
    return grad


@triton.jit
def short_conv_bwd_kernel(
    X, W, SEQ_POS, DY, DX, DW_PARTIAL, T, C, N, X_STRIDE, DX_STRIDE,
    K: tl.constexpr, HAS_SEQ_POS: tl.constexpr, ACTIVATION: tl.constexpr, NORM: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """The backward of one segment over ROWS rows × BLOCK_C channels: dx[r] = Σ_s [pos[r + s] ≥ s] w_s ·
    dpre[r + s] and DW_PARTIAL[program row, :, K−1−j] = Σ_r x[r − j] · dpre[r] over the program's rows, where
    dpre is ``_output_to_pre`` of dy with pre recomputed from x (dy itself without ACTIVATION and NORM). x and
    dx have rows X_STRIDE and DX_STRIDE apart (C channels of wider tensors), dy is contiguous [N, C].

    dx takes dpre rounded to x's dtype (the rounding autograd's SiLU backward applies) and adds its taps in
    the order s = 0, 1, …; the weight gradient takes dpre unrounded. Row r + 1's x, dy and position are
    loaded before row r's math. Taps are unrolled up to 8 (``conv.MAX_KERNEL_SIZE``) as named values, taps ≥ K
    pruned at compile time. A row with pos < K − 1 (a document or batch row began less than K − 1 rows ago:
    a uniform branch, rare) masks the taps that would reach across that start."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    dtype: tl.constexpr = X.dtype.element_ty
    r0 = tl.program_id(0) * ROWS
    own = tl.minimum(ROWS, N - r0)
    # Named per tap j: weight w_j, the window x_j = x[r − j], its masked copy m_j, the weight gradient's
    # accumulator acc_j, and p_j: the dx of row r − j so far (taps 0 .. j − 1).
    w0 = _tap(W, cols, col_ok, K, 0, dtype)
    acc0 = tl.zeros([BLOCK_C], dtype=tl.float32)
    if K > 1:
        w1 = _tap(W, cols, col_ok, K, 1, dtype)
        x1 = _row(X, r0 - 1, cols, col_ok, X_STRIDE, N)
        acc1 = tl.zeros([BLOCK_C], dtype=tl.float32)
        p1 = tl.zeros([BLOCK_C], dtype=tl.float32)
    if K > 2:
        w2 = _tap(W, cols, col_ok, K, 2, dtype)
        x2 = _row(X, r0 - 2, cols, col_ok, X_STRIDE, N)
        acc2 = tl.zeros([BLOCK_C], dtype=tl.float32)
        p2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    if K > 3:
        w3 = _tap(W, cols, col_ok, K, 3, dtype)
        x3 = _row(X, r0 - 3, cols, col_ok, X_STRIDE, N)
        acc3 = tl.zeros([BLOCK_C], dtype=tl.float32)
        p3 = tl.zeros([BLOCK_C], dtype=tl.float32)
    if K > 4:
        w4 = _tap(W, cols, col_ok, K, 4, dtype)
        x4 = _row(X, r0 - 4, cols, col_ok, X_STRIDE, N)
        acc4 = tl.zeros([BLOCK_C], dtype=tl.float32)
        p4 = tl.zeros([BLOCK_C], dtype=tl.float32)
    if K > 5:
        w5 = _tap(W, cols, col_ok, K, 5, dtype)
        x5 = _row(X, r0 - 5, cols, col_ok, X_STRIDE, N)
        acc5 = tl.zeros([BLOCK_C], dtype=tl.float32)
        p5 = tl.zeros([BLOCK_C], dtype=tl.float32)
    if K > 6:
        w6 = _tap(W, cols, col_ok, K, 6, dtype)
        x6 = _row(X, r0 - 6, cols, col_ok, X_STRIDE, N)
        acc6 = tl.zeros([BLOCK_C], dtype=tl.float32)
        p6 = tl.zeros([BLOCK_C], dtype=tl.float32)
    if K > 7:
        w7 = _tap(W, cols, col_ok, K, 7, dtype)
        x7 = _row(X, r0 - 7, cols, col_ok, X_STRIDE, N)
        acc7 = tl.zeros([BLOCK_C], dtype=tl.float32)
        p7 = tl.zeros([BLOCK_C], dtype=tl.float32)
    x0 = _row(X, r0, cols, col_ok, X_STRIDE, N)
    dy = _row(DY, r0, cols, col_ok, C, N)
    pos = _row_position(SEQ_POS, r0, T, N, HAS_SEQ_POS)
    for i in range(own + K - 1):
        r = r0 + i
        next_x = _row(X, r + 1, cols, col_ok, X_STRIDE, N)
        next_dy = _row(DY, r + 1, cols, col_ok, C, N)
        next_pos = _row_position(SEQ_POS, r + 1, T, N, HAS_SEQ_POS)
        pre = x0 * w0
        if K > 1:
            m1 = x1
        if K > 2:
            m2 = x2
        if K > 3:
            m3 = x3
        if K > 4:
            m4 = x4
        if K > 5:
            m5 = x5
        if K > 6:
            m6 = x6
        if K > 7:
            m7 = x7
        if pos < K - 1:
            if K > 1:
                m1 = _reach(x1, pos, 1)
            if K > 2:
                m2 = _reach(x2, pos, 2)
            if K > 3:
                m3 = _reach(x3, pos, 3)
            if K > 4:
                m4 = _reach(x4, pos, 4)
            if K > 5:
                m5 = _reach(x5, pos, 5)
            if K > 6:
                m6 = _reach(x6, pos, 6)
            if K > 7:
                m7 = _reach(x7, pos, 7)
        if K > 1:
            pre += m1 * w1
        if K > 2:
            pre += m2 * w2
        if K > 3:
            pre += m3 * w3
        if K > 4:
            pre += m4 * w4
        if K > 5:
            pre += m5 * w5
        if K > 6:
            pre += m6 * w6
        if K > 7:
            pre += m7 * w7
        dpre = dy
        if ACTIVATION or NORM:
            dpre = _output_to_pre(dpre, pre, ACTIVATION, NORM)
        if i < own:
            acc0 += x0 * dpre
            if K > 1:
                acc1 += m1 * dpre
            if K > 2:
                acc2 += m2 * dpre
            if K > 3:
                acc3 += m3 * dpre
            if K > 4:
                acc4 += m4 * dpre
            if K > 5:
                acc5 += m5 * dpre
            if K > 6:
                acc6 += m6 * dpre
            if K > 7:
                acc7 += m7 * dpre
        # Tap s carries this row's dpre to dx[r − s] where pos[r] ≥ s: t_s.
        t0 = dpre.to(dtype).to(tl.float32)
        if K > 1:
            t1 = t0
        if K > 2:
            t2 = t0
        if K > 3:
            t3 = t0
        if K > 4:
            t4 = t0
        if K > 5:
            t5 = t0
        if K > 6:
            t6 = t0
        if K > 7:
            t7 = t0
        if pos < K - 1:
            if K > 1:
                t1 = _reach(t0, pos, 1)
            if K > 2:
                t2 = _reach(t0, pos, 2)
            if K > 3:
                t3 = _reach(t0, pos, 3)
            if K > 4:
                t4 = _reach(t0, pos, 4)
            if K > 5:
                t5 = _reach(t0, pos, 5)
            if K > 6:
                t6 = _reach(t0, pos, 6)
            if K > 7:
                t7 = _reach(t0, pos, 7)
        # Row r − (K − 1) is complete with its last tap; the others take theirs and move one row older.
        if K == 1:
            dx = t0 * w0
        if K == 2:
            dx = p1 + t1 * w1
        if K == 3:
            dx = p2 + t2 * w2
        if K == 4:
            dx = p3 + t3 * w3
        if K == 5:
            dx = p4 + t4 * w4
        if K == 6:
            dx = p5 + t5 * w5
        if K == 7:
            dx = p6 + t6 * w6
        if K == 8:
            dx = p7 + t7 * w7
        done = r - (K - 1)
        row_ok = col_ok & (tl.zeros_like(cols) + i >= K - 1)
        tl.store(DX + done.to(tl.int64) * DX_STRIDE + cols, dx.to(DX.dtype.element_ty), mask=row_ok)
        if K > 7:
            p7 = p6 + t6 * w6
            x7 = x6
        if K > 6:
            p6 = p5 + t5 * w5
            x6 = x5
        if K > 5:
            p5 = p4 + t4 * w4
            x5 = x4
        if K > 4:
            p4 = p3 + t3 * w3
            x4 = x3
        if K > 3:
            p3 = p2 + t2 * w2
            x3 = x2
        if K > 2:
            p2 = p1 + t1 * w1
            x2 = x1
        if K > 1:
            p1 = t0 * w0
            x1 = x0
        x0, dy, pos = next_x, next_dy, next_pos
    dw_row = DW_PARTIAL + tl.program_id(0).to(tl.int64) * C * K + cols * K + K - 1
    tl.store(dw_row, acc0, mask=col_ok)
    if K > 1:
        tl.store(dw_row - 1, acc1, mask=col_ok)
    if K > 2:
        tl.store(dw_row - 2, acc2, mask=col_ok)
    if K > 3:
        tl.store(dw_row - 3, acc3, mask=col_ok)
    if K > 4:
        tl.store(dw_row - 4, acc4, mask=col_ok)
    if K > 5:
        tl.store(dw_row - 5, acc5, mask=col_ok)
    if K > 6:
        tl.store(dw_row - 6, acc6, mask=col_ok)
    if K > 7:
        tl.store(dw_row - 7, acc7, mask=col_ok)
