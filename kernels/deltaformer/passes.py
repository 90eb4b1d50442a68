"""Forward and backward passes of DeltaFormer attention as sequences of kernel launches (no autograd here).

Stage 1 solves (I + diag(β)P) U = V with P[t,i] = exp2(s[t,i] − lse_t) over the earlier keys of t's
document (s = scale·w·k in the log2 domain); stage 2 is o = causal softmax(scale·q·kᵀ)·U.

Forward, superblock by superblock (``config.superblock`` rows): one preparation launch (``prep.py``:
normalisers, the sums over earlier superblocks, the diagonal-block inverses), then the wavefront solve
(``wavefront.py``) of U and P·U. With w = q (the default probe) stage 2 shares stage 1's scores plus the
diagonal, so the solve writes o itself: o_t = α_t (P U)_t + (1 − α_t) U_t, α_t = Z_t / (Z_t + e^{s_tt}),
Z_t = Σ_{i<t} e^{s_ti} (α = 0 at a document's first token). With a separate w, stage 2 is a causal
flash-attention forward over U (``rows.py``).

Backward: (separate w: stage 2's flash backward gives dq, dk and dU first) → the transposed solve gives
G = dv and the score cotangent Y_t = α_t dO_t − β_t G_t (α = 0 and dO → dU with separate w), as one
wavefront launch (width <= 64) or superblock by superblock (``solve.py``) → with D_t = Y_t·(P U)_t − c_t
one row pass gives dw (= dq for w = q) and one key pass gives dk, where c_t = dα_t α_t (1 − α_t) carries
α's dependence on Z; dβ_t = −G_t·(P U)_t; the diagonal score s_tt adds −c_t to the last two. Saved
between passes: q, k, v, w, β, U, P U, o, lse — O(B·T·H·D); the diagonal-block inverses are rebuilt.
"""

from __future__ import annotations

import torch

from titan_delta_kernels.deltaformer._common import dot_precision, inverse_precision, new_buffer
from titan_delta_kernels.deltaformer.cols import col_backward
from titan_delta_kernels.deltaformer.config import LaunchConfig
from titan_delta_kernels.deltaformer.inverse import diag_inverse
from titan_delta_kernels.deltaformer.prep import prep_superblock
from titan_delta_kernels.deltaformer.rows import row_backward, row_forward
from titan_delta_kernels.deltaformer.rowstats import score_cotangents, stage2_weights
from titan_delta_kernels.deltaformer.solve import solve_backward
from titan_delta_kernels.deltaformer.wavefront import superblock_flags, superblock_wave_solve, wave_backward


def _superblocks(seq_len: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + size, seq_len)) for lo in range(0, seq_len, size)]


def _tiles(dtype: torch.dtype, cfg: LaunchConfig) -> tuple[dict, dict]:
    """Launch keywords of the row kernels (each program owns ``tiles[0]`` rows and streams ``tiles[1]``
    keys at a time) and of the key kernels (owns ``tiles[0]`` keys, streams ``tiles[1]`` rows)."""
    own, streamed, warps, stages = cfg.tiles
    common = dict(dot_prec=dot_precision(dtype), num_warps=warps, num_stages=stages)
    return dict(block=own, keys=streamed, **common), dict(block=streamed, keys=own, **common)


def forward_pass(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, w: torch.Tensor | None,
    doc_start: torch.Tensor | None, scale: float, cfg: LaunchConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """o (q's dtype), U and P·U (v's dtype), lse1 and lse2 (fp32 [B, H, T], log2 domain; lse2 is
    [B, H, 0] when w is None, as stage 2 then needs no normaliser of its own)."""
    B, T, H, _ = q.shape
    x = q if w is None else w
    prec, inv_prec = dot_precision(q.dtype), inverse_precision(q.dtype)
    f32 = dict(device=q.device, dtype=torch.float32)
    lse1 = new_buffer((B, H, T), **f32)
    linv = new_buffer((B * H, -(-T // cfg.chunk), cfg.chunk, cfg.chunk), **f32)
    u = new_buffer(v.shape, device=v.device, dtype=v.dtype)
    pu = new_buffer(v.shape, device=v.device, dtype=v.dtype)
    o = new_buffer(v.shape, device=q.device, dtype=q.dtype)
    blocks = _superblocks(T, cfg.superblock)
    partial = new_buffer(v.shape, **f32) if len(blocks) > 1 else None
    flags = superblock_flags(B * H, T, cfg.chunk, cfg.superblock, q.device)
    warps, stages = cfg.wave_forward_launch
    for lo, hi in blocks:
        prep_superblock(x, k, u, beta, lse1, partial, linv, doc_start, row_lo=lo, row_hi=hi, scale=scale,
                        chunk=cfg.chunk, tiles=cfg.prep, dot_prec=prec, inv_prec=inv_prec,
                        max_registers=cfg.prep_registers)
        superblock_wave_solve(x, k, v, u, pu, o if w is None else None, beta, lse1, linv,
                              partial if lo > 0 else None, doc_start, flags, row_lo=lo, row_hi=hi,
                              superblock=cfg.superblock, scale=scale, chunk=cfg.chunk, dot_prec=prec,
                              inv_prec=inv_prec, num_warps=warps, num_stages=stages)
    if w is None:
        return o, u, pu, lse1, lse1.new_empty((B, H, 0))
    lse2 = new_buffer((B, H, T), **f32)
    row_forward(q, k, u, lse2, o, doc_start, scale=scale, **_tiles(q.dtype, cfg)[0])
    return o, u, pu, lse1, lse2


def _transposed_solve(
    x: torch.Tensor, k: torch.Tensor, src: torch.Tensor, alpha: torch.Tensor | None, g: torch.Tensor,
    y: torch.Tensor, beta: torch.Tensor, lse1: torch.Tensor, doc_start: torch.Tensor | None,
    doc_end: torch.Tensor | None, scale: float, cfg: LaunchConfig,
) -> None:
    """G and Y in place: one wavefront launch, or superblocks from the end, each after the sum over the
    later superblocks (a parallel key-kernel launch)."""
    T = x.shape[1]
    prec, inv_prec = dot_precision(x.dtype), inverse_precision(x.dtype)
    if cfg.wave_backward:
        warps, stages = cfg.wave_backward_launch
        wave_backward(x, k, src, alpha, g, y, beta, lse1, doc_start, doc_end, scale=scale, chunk=cfg.chunk,
                      dot_prec=prec, inv_prec=inv_prec, num_warps=warps, num_stages=stages)
        return
    linv = diag_inverse(x, k, beta, lse1, doc_start, scale=scale, chunk=cfg.chunk, dot_prec=prec,
                        inv_prec=inv_prec)
    warps, stages = cfg.solve_launch
    partial = None
    for lo, hi in reversed(_superblocks(T, cfg.backward_superblock)):
        if hi < T:
            if partial is None:
                partial = new_buffer(src.shape, device=x.device, dtype=torch.float32)
            col_backward(x, k, None, y, lse1, None, None, partial, doc_start, doc_end, scale=scale,
                         strict=True, key_base=lo, key_stop=hi, row_from=hi, **_tiles(x.dtype, cfg)[1])
        solve_backward(x, k, src, alpha, g, y, beta, lse1, linv, partial if hi < T else None, doc_start,
                       doc_end, row_lo=lo, row_hi=hi, scale=scale, chunk=cfg.chunk,
                       value_block=cfg.value_block, dot_prec=prec, inv_prec=inv_prec, num_warps=warps,
                       num_stages=stages)


def backward_pass(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
    w: torch.Tensor | None, u: torch.Tensor, pu: torch.Tensor, o: torch.Tensor, lse1: torch.Tensor,
    lse2: torch.Tensor, doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, scale: float,
    cfg: LaunchConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """fp32 gradients dq, dk, dv, dβ and dw (None when w is None: then dq holds both stages; dq and dk
    are then in q's dtype)."""
    x = q if w is None else w
    rows, cols = _tiles(q.dtype, cfg)
    f32 = dict(device=q.device, dtype=torch.float32)
    do = do.contiguous()
    if w is None:
        alpha = new_buffer(beta.shape, **f32)
        c = new_buffer(beta.shape, **f32)
        stage2_weights(q, k, do, pu, u, lse1, doc_start, alpha, c, scale=scale)
        src = do
    else:  # stage 2 on its own: flash-attention backward over (q, k, U)
        alpha, c = None, None
        d2 = (do.float() * o.float()).sum(-1).transpose(1, 2).contiguous()  # [B, H, T]
        dq2 = new_buffer(q.shape, **f32)
        row_backward(q, k, u, do, lse2, d2, dq2, doc_start, scale=scale, strict=False, **rows)
        dk2 = new_buffer(k.shape, **f32)
        src = new_buffer(v.shape, **f32)
        col_backward(q, k, u, do, lse2, d2, dk2, src, doc_start, doc_end, scale=scale, strict=False, **cols)
    g = new_buffer(v.shape, **f32)
    y = new_buffer(v.shape, **f32)
    _transposed_solve(x, k, src, alpha, g, y, beta, lse1, doc_start, doc_end, scale, cfg)
    dvec = new_buffer(lse1.shape, **f32)
    dbeta = new_buffer(beta.shape, device=beta.device, dtype=beta.dtype)
    score_cotangents(y, g, pu, c, dvec, dbeta)
    # w = q: write dq, dk straight in the input dtype (nothing is added to them afterwards).
    grad = dict(device=q.device, dtype=q.dtype if w is None else torch.float32)
    dx = new_buffer(x.shape, **grad)
    row_backward(x, k, u, y, lse1, dvec, dx, doc_start, scale=scale, strict=True, diag_c=c, **rows)
    dk = new_buffer(k.shape, **grad)
    col_backward(x, k, u, y, lse1, dvec, dk, None, doc_start, doc_end, scale=scale, strict=True, diag_c=c,
                 **cols)
    if w is None:
        return dx, dk, g, dbeta, None
    return dq2, dk + dk2, g, dbeta, dx
