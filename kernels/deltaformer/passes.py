"""Forward and backward passes of DeltaFormer attention as sequences of kernel launches (no autograd here).

docs/kernels_deltaformer.md derives both: stage 1 solves (I + diag(β)P) U = V, stage 2 is
o = causal softmax(scale·q·kᵀ)·U, which with w = q the forward solve writes itself.
"""

from __future__ import annotations

import torch

from titan_delta_kernels._launch import cdiv
from titan_delta_kernels.deltaformer._common import dot_precision, inverse_precision, new_buffer
from titan_delta_kernels.deltaformer.cols import col_backward
from titan_delta_kernels.deltaformer.config import LaunchConfig
from titan_delta_kernels.deltaformer.inverse import diag_inverse, inverse_buffers
from titan_delta_kernels.deltaformer.prep import prep_superblock
from titan_delta_kernels.deltaformer.rows import row_backward, row_forward, score_cotangents, stage2_weights
from titan_delta_kernels.deltaformer.solve import solve_backward
from titan_delta_kernels.deltaformer.wavefront import superblock_wave_solve, wave_backward


def _superblocks(seq_len: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + size, seq_len)) for lo in range(0, seq_len, size)]


def forward_pass(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, w: torch.Tensor | None,
    doc_start: torch.Tensor | None, scale: float, cfg: LaunchConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """o (q's dtype), U and P·U (v's dtype), fp32 log2 normalisers lse1 and lse2 ([B, H, 0] for w = q)."""
    B, T, H, _ = q.shape
    x = q if w is None else w
    f32 = dict(device=q.device, dtype=torch.float32)
    lse1 = new_buffer((B, H, T), **f32)
    linv, scales = inverse_buffers(B * H, cdiv(T, cfg.chunk), cfg.chunk, x.dtype, x.device)
    u = new_buffer(v.shape, device=v.device, dtype=v.dtype)
    pu = new_buffer(v.shape, device=v.device, dtype=v.dtype)
    o = new_buffer(v.shape, device=q.device, dtype=q.dtype)
    blocks = _superblocks(T, cfg.superblock)
    partial = new_buffer(v.shape, **f32) if len(blocks) > 1 else None
    # one flag per (b, h, chunk), then one ticket counter per superblock
    flags = torch.zeros(B * H * cdiv(T, cfg.chunk) + len(blocks), device=q.device, dtype=torch.int32)
    for lo, hi in blocks:
        prep_superblock(x, k, u, beta, lse1, partial, linv, scales, doc_start, lo, hi, scale, cfg)
        superblock_wave_solve(x, k, v, u, pu, o if w is None else None, beta, lse1, linv, scales,
                              partial if lo > 0 else None, doc_start, flags, lo, hi, scale, cfg)
    if w is None:
        return o, u, pu, lse1, lse1.new_empty((B, H, 0))
    lse2 = new_buffer((B, H, T), **f32)
    row_forward(q, k, u, lse2, o, doc_start, scale, cfg)
    return o, u, pu, lse1, lse2


def _transposed_solve(
    x: torch.Tensor, k: torch.Tensor, u: torch.Tensor, src: torch.Tensor, alpha: torch.Tensor | None,
    g: torch.Tensor, y: torch.Tensor, beta: torch.Tensor, lse1: torch.Tensor, pu: torch.Tensor,
    c: torch.Tensor | None, dvec: torch.Tensor, dbeta: torch.Tensor, dk: torch.Tensor,
    doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, scale: float, cfg: LaunchConfig,
) -> None:
    """G, Y, the row scalars D (``dvec``) and dβ, and the stage-1 key gradient ``dk``, in place: one
    wavefront launch (which also fills stage 2's ``c`` for w = q; ``alpha`` is None), or superblocks from
    the end (each after a key launch), a row pass for the scalars and a key pass for dk."""
    T = x.shape[1]
    linv, scales = diag_inverse(x, k, beta, lse1, doc_start, scale=scale, chunk=cfg.chunk,
                                dot_prec=dot_precision(x.dtype), inv_prec=inverse_precision(x.dtype))
    if cfg.wave_backward:
        _wave_superblocks(x, k, u, src, g, y, beta, lse1, linv, scales, pu, c, dvec, dbeta, dk, doc_start,
                          doc_end, scale, cfg)
        return
    partial = None
    for lo, hi in reversed(_superblocks(T, cfg.backward_superblock)):
        if hi < T:
            if partial is None:
                partial = new_buffer(src.shape, device=x.device, dtype=torch.float32)
            col_backward(x, k, None, y, lse1, None, None, partial, doc_start, doc_end, scale, cfg,
                         strict=True, key_base=lo, key_stop=hi, row_from=hi)
        solve_backward(x, k, src, alpha, g, y, beta, lse1, linv, scales, partial if hi < T else None,
                       doc_start, doc_end, lo, hi, scale, cfg)
    score_cotangents(src, alpha, beta, g, pu, c, dvec, dbeta)
    col_backward(x, k, u, y, lse1, dvec, dk, None, doc_start, doc_end, scale, cfg, strict=True, diag_c=c)


def _wave_superblocks(
    x: torch.Tensor, k: torch.Tensor, u: torch.Tensor, src: torch.Tensor, g: torch.Tensor, y: torch.Tensor,
    beta: torch.Tensor, lse1: torch.Tensor, linv: torch.Tensor, scales: torch.Tensor, pu: torch.Tensor,
    c: torch.Tensor | None, dvec: torch.Tensor, dbeta: torch.Tensor, dk: torch.Tensor,
    doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, scale: float, cfg: LaunchConfig,
) -> None:
    """The wavefront backward superblock by superblock from the end: before each superblock but the last,
    key launches sum the rows already solved after it over its keys (Σ Pᵀ Y, and those rows' part of dk),
    work that needs no chain; the superblock's wavefront then adds them to its own. One wavefront runs each
    (b, h) as one chain of chunks, so the sums over many later chunks gain from the parallel launches.
    ``cfg.wave_backward_superblock`` rows per superblock; 0: one wavefront over all rows."""
    B, T, H, _ = x.shape
    blocks = _superblocks(T, cfg.wave_backward_superblock or max(T, 1))
    n_flags = B * H * cdiv(T, cfg.chunk)
    flags = torch.zeros(n_flags + len(blocks), device=x.device, dtype=torch.int32)  # and a counter each
    later = None
    for index in reversed(range(len(blocks))):
        lo, hi = blocks[index]
        if hi < T:
            if later is None:
                f32 = dict(device=x.device, dtype=torch.float32)
                later = (new_buffer(src.shape, **f32), new_buffer(x.shape, **f32))
            # two launches: the Σ Pᵀ Y launch alone may split its rows over more programs
            # (``later_rows_splits``) where the key programs are few; a dk launch writes dk whole
            col_backward(x, k, None, y, lse1, None, None, later[0], doc_start, doc_end, scale, cfg,
                         strict=True, key_base=lo, key_stop=hi, row_from=hi)
            col_backward(x, k, u, y, lse1, dvec, later[1], None, doc_start, doc_end, scale, cfg,
                         strict=True, key_base=lo, key_stop=hi, row_from=hi)
        wave_backward(x, k, u, src, g, y, beta, lse1, linv, scales, pu, c, dvec, dbeta, dk,
                      later if hi < T else None, flags, flags[n_flags + index:], doc_start, doc_end, lo, hi,
                      scale, cfg)


def backward_pass(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
    w: torch.Tensor | None, u: torch.Tensor, pu: torch.Tensor, o: torch.Tensor, lse1: torch.Tensor,
    lse2: torch.Tensor, doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, scale: float,
    cfg: LaunchConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients dq, dk, dv, dβ and dw: fp32, except that with w = q (dw None, dq holds both stages) dq and
    dk come in q's dtype, and dv in v's dtype from the wavefront backward (``cfg.wave_backward``)."""
    x = q if w is None else w
    f32 = dict(device=q.device, dtype=torch.float32)
    do = do.contiguous()
    if w is None:  # stage 2's diagonal weights: the wavefront backward forms α and c itself
        alpha = None if cfg.wave_backward else new_buffer(beta.shape, **f32)
        c = new_buffer(beta.shape, **f32)
        if alpha is not None:
            stage2_weights(q, k, do, pu, u, lse1, doc_start, alpha, c, scale=scale)
        src = do
    else:  # stage 2 on its own: flash-attention backward over (q, k, U)
        alpha, c = None, None
        d2 = (do.float() * o.float()).sum(-1).transpose(1, 2).contiguous()  # [B, H, T]
        dq2 = new_buffer(q.shape, **f32)
        row_backward(q, k, u, do, lse2, d2, dq2, doc_start, scale, cfg, strict=False)
        dk2 = new_buffer(k.shape, **f32)
        src = new_buffer(v.shape, **f32)
        col_backward(q, k, u, do, lse2, d2, dk2, src, doc_start, doc_end, scale, cfg, strict=False)
    # G (= dv) straight in v's dtype where the wavefront also forms the row scalars from it; the superblock
    # path's row pass reads it back, so it stays fp32 there. Y in the input dtype: its readers round it so.
    g = new_buffer(v.shape, device=v.device, dtype=v.dtype if cfg.wave_backward else torch.float32)
    y = new_buffer(v.shape, device=x.device, dtype=x.dtype)
    dvec = new_buffer(lse1.shape, **f32)
    dbeta = new_buffer(beta.shape, device=beta.device, dtype=beta.dtype)
    # w = q: dq, dk straight in the input dtype (nothing is added to them afterwards)
    grad = dict(device=q.device, dtype=q.dtype if w is None else torch.float32)
    dk = new_buffer(k.shape, **grad)
    _transposed_solve(x, k, u, src, alpha, g, y, beta, lse1, pu, c, dvec, dbeta, dk, doc_start, doc_end,
                      scale, cfg)
    dx = new_buffer(x.shape, **grad)
    row_backward(x, k, u, y, lse1, dvec, dx, doc_start, scale, cfg, strict=True, diag_c=c)
    if w is None:
        return dx, dk, g, dbeta, None
    return dq2, dk + dk2, g, dbeta, dx
