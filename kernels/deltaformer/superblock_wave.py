"""The forward solve of one superblock as a wavefront: a program per (chunk, b, h) (variant ``wavesb``).

The superblock schedule keeps its fully parallel preparation launch (``prep.py``: normalisers, the sums
over earlier superblocks, the diagonal-block inverses), but the sequential part, where one program per
(b, h) walks the superblock's chunks, becomes one program per chunk: the program of chunk c adds
Σ_j P_cj U_j over the superblock's earlier chunks — those solved long ago after a single wait, the last
DEFER one by one as their flags rise — applies the prepared inverse and raises its own flag. Tickets
from an atomic counter order the programs chunk-major, so a program only waits for programs that took
earlier tickets (see ``wavefront.py``). At B·H = 128 and 8 chunks per superblock this spreads the
superblock's 28 key-tile steps per (b, h) over 8 programs instead of one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from titan_delta_kernels._launch import cdiv, launch, next_power_of_2
from titan_delta_kernels.deltaformer._common import LOG2_E, register_cap
from titan_delta_kernels.deltaformer.inverse import log2_split, store_unit_lower_inverse
from titan_delta_kernels.deltaformer.wavefront import (
    _add_chunk_values,
    _chunk_probs,
    _finish_chunk,
    _wait_for,
)


@triton.jit
def _superblock_wave_kernel(
    X, K, V, U, PU, O, BETA, LSE, LINV, R, FLAGS, COUNTER, DOC_START,
    T, H, BH, n_chunks, row_lo, row_hi, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    DEFER: tl.constexpr, HAS_R: tl.constexpr, FUSED_OUT: tl.constexpr, VARLEN: tl.constexpr,
    BUILD_INV: tl.constexpr, LOG2_BT: tl.constexpr, LOG2_SPLIT: tl.constexpr,
    DOT_PREC: tl.constexpr, INV_PREC: tl.constexpr,
):
    ticket = tl.atomic_add(COUNTER, 1)
    c = row_lo // BT + ticket // BH
    pid_bh = ticket % BH
    b = pid_bh // H
    h = pid_bh % H
    flags = FLAGS + pid_bh * n_chunks
    offs = tl.arange(0, BT)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BV)
    c0 = c * BT
    rows = c0 + offs
    row_ok = rows < row_hi
    wk_ptrs = ((b * T + rows) * H + h)[:, None] * D + offs_d[None, :]
    wk_mask = row_ok[:, None] & (offs_d < D)[None, :]
    vu_ptrs = ((b * T + rows) * H + h)[:, None] * DV + offs_v[None, :]
    vu_mask = row_ok[:, None] & (offs_v < DV)[None, :]
    x = tl.load(X + wk_ptrs, mask=wk_mask, other=0.0)
    lse = tl.load(LSE + pid_bh * T + rows, mask=row_ok, other=0.0)
    if VARLEN:
        row_doc = tl.load(DOC_START + rows, mask=row_ok, other=0)
        j_lo = tl.maximum(row_lo, tl.load(DOC_START + c0)) // BT
    else:
        row_doc = rows  # unused
        j_lo = row_lo // BT
    inv_base = LINV + (pid_bh * n_chunks + c) * BT * BT
    if BUILD_INV:  # before any wait, with nothing else live yet: off the chain and light on registers
        k_c = tl.load(K + wk_ptrs, mask=wk_mask, other=0.0)
        beta_c = tl.load(BETA + (b * T + rows) * H + h, mask=row_ok, other=0.0).to(tl.float32)
        s_cc = tl.dot(x, tl.trans(k_c), input_precision=DOT_PREC) * qk_scale
        in_block = (offs[None, :] < offs[:, None]) & row_ok[:, None]
        if VARLEN:
            in_block = in_block & (rows[None, :] >= row_doc[:, None])
        neg = -tl.where(in_block, tl.exp2(s_cc - lse[:, None]), 0.0) * beta_c[:, None]
        store_unit_lower_inverse(inv_base, neg, BT, LOG2_BT, LOG2_SPLIT, INV_PREC)
        tl.debug_barrier()  # read back below by other threads
    acc = tl.load(R + vu_ptrs, mask=vu_mask, other=0.0) if HAS_R else tl.zeros([BT, BV], dtype=tl.float32)
    j_def = tl.maximum(j_lo, c - DEFER)
    if j_def > j_lo:  # its flag vouches for every earlier chunk of the superblock it needed
        _wait_for(flags, j_def - 1)
    for j in range(j_lo, j_def):
        p = _chunk_probs(x, lse, row_ok, row_doc, K, T, H, b, h, j, qk_scale, D, BD, BT, VARLEN, DOT_PREC)
        acc = _add_chunk_values(acc, p, U, T, H, b, h, j, DV, BV, BT, DOT_PREC)
    beta = tl.load(BETA + (b * T + rows) * H + h, mask=row_ok, other=0.0).to(tl.float32)
    v = tl.load(V + vu_ptrs, mask=vu_mask, other=0.0).to(tl.float32)
    inv = tl.load(inv_base + offs[:, None] * BT + offs[None, :])
    _finish_chunk(acc, inv, v, beta, x, lse, rows, row_ok, row_doc, K, U, PU, O, flags, T, H, b, h, c, j_lo,
                  qk_scale, D, DV, BD, BV, BT, DEFER, FUSED_OUT, VARLEN, DOT_PREC, INV_PREC)


def superblock_flags(batch_heads: int, seq_len: int, chunk: int, superblock: int,
                     device: torch.device) -> torch.Tensor:
    """Zeroed int32: one flag per (b, h, chunk), then one ticket counter per superblock."""
    n_chunks = cdiv(seq_len, chunk)
    return torch.zeros(batch_heads * n_chunks + cdiv(seq_len, superblock), device=device,
                       dtype=torch.int32)


def superblock_wave_solve(
    x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor, pu: torch.Tensor,
    o: torch.Tensor | None, beta: torch.Tensor, lse: torch.Tensor, linv: torch.Tensor,
    partial: torch.Tensor | None, doc_start: torch.Tensor | None, flags: torch.Tensor, *, row_lo: int,
    row_hi: int, superblock: int, scale: float, chunk: int, defer: int, dot_prec: str, inv_prec: str,
    num_warps: int, num_stages: int, build_inverse: bool = False, inv_split: int = 1, max_registers: int = 0,
) -> None:
    """Rows [row_lo, row_hi) of U, P·U and (w = q) o, as ``solve.solve_forward`` does with one program per
    (b, h); ``flags`` comes from ``superblock_flags`` (one buffer for all superblocks of a forward). With
    ``build_inverse`` each program builds its chunk's inverse into ``linv`` itself (variant ``waveinv``:
    the preparation launch then skips them), else it reads what the preparation launch left there."""
    B, T, H, D = x.shape
    DV = v.shape[-1]
    n_chunks = cdiv(T, chunk)
    counter = flags[B * H * n_chunks + row_lo // superblock:]
    launch(
        _superblock_wave_kernel, (cdiv(row_hi - row_lo, chunk) * B * H,),
        x, k, v, u, pu, o if o is not None else pu, beta, lse, linv, partial if partial is not None else lse,
        flags, counter, doc_start if doc_start is not None else flags, T, H, B * H, n_chunks, row_lo, row_hi,
        scale * LOG2_E,
        D=D, DV=DV, BD=next_power_of_2(D), BV=next_power_of_2(DV), BT=chunk, DEFER=defer,
        HAS_R=partial is not None, FUSED_OUT=o is not None, VARLEN=doc_start is not None,
        BUILD_INV=build_inverse, LOG2_BT=chunk.bit_length() - 1, LOG2_SPLIT=log2_split(chunk, inv_split),
        DOT_PREC=dot_prec, INV_PREC=inv_prec, num_warps=num_warps, num_stages=num_stages,
        **register_cap(max_registers),
    )
