"""Forward and backward passes of DeltaFormer attention as sequences of kernel launches (no autograd here).

Forward:  lse1 = κ1 normalisers (strictly causal)  →  diagonal-block inverses  →  U and (P U) superblock
by superblock (parallel contribution of earlier superblocks, then the sequential walk)  →  stage 2.
With w = q (the default probe) stage 2 shares stage 1's scores, so it needs no pass of its own:
o_t = α_t (P U)_t + (1 − α_t) U_t, α_t = Z_t / (Z_t + e^{s_tt}), written by the solve itself.
With a separate w, stage 2 is a causal flash-attention forward over U.

Backward: (separate w: stage-2 flash backward gives dq, dk and dU first)  →  transposed solve from the
end gives G = dv and the score cotangent Y_t = α_t dO_t − β_t G_t (α = 0 and dO → dU with separate w)
→  with D_t = Y_t·(P U)_t − c_t one row pass gives dw (= dq for w = q) and one key pass gives dk, where
c_t = dα_t α_t (1 − α_t) carries α's dependence on Z; dβ_t = −G_t·(P U)_t; the diagonal score s_tt
adds −c_t to the last two. Saved between passes: q, k, v, w, β, U, P U, o, lse — O(B·T·H·D); the
T×chunk inverses are rebuilt (or, with the opt-in ``keepinv`` variant, kept from the forward).
Opt-in ``fused`` variant: the normaliser pass, the inverse pass and each superblock's contribution pass
become one launch per superblock (``prep.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from titan_delta_kernels.deltaformer._common import BlockConfig, dot_precision, inverse_precision, new_buffer
from titan_delta_kernels.deltaformer.cols import col_backward
from titan_delta_kernels.deltaformer.prep import prep_superblock
from titan_delta_kernels.deltaformer.rows import row_backward, row_forward
from titan_delta_kernels.deltaformer.rowstats import score_cotangents, stage2_weights
from titan_delta_kernels.deltaformer.solve import diag_inverse, solve_backward, solve_forward
from titan_delta_kernels.deltaformer.superblock_wave import superblock_flags, superblock_wave_solve
from titan_delta_kernels.deltaformer.wavefront import inverse_buffer, wave_backward, wave_forward


def _superblocks(seq_len: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + size, seq_len)) for lo in range(0, seq_len, size)]


def _settings(dtype: torch.dtype, cfg: BlockConfig) -> tuple[dict, dict, dict]:
    """Launch keywords of the row kernels, the key (column) kernels and the solve kernels."""
    prec, inv_prec = dot_precision(dtype), inverse_precision(dtype)
    r_rows, r_keys, r_warps, r_stages = cfg.row_tiles
    c_keys, c_rows, c_warps, c_stages = cfg.col_tiles
    rows = dict(block=r_rows, keys=r_keys, dot_prec=prec, num_warps=r_warps, num_stages=r_stages)
    cols = dict(block=c_rows, keys=c_keys, dot_prec=prec, num_warps=c_warps, num_stages=c_stages)
    solve = dict(chunk=cfg.chunk, solve_tile=cfg.solve_tile, value_split=cfg.value_split, dot_prec=prec,
                 inv_prec=inv_prec, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return rows, cols, solve


def _inverses(x: torch.Tensor, k: torch.Tensor, beta: torch.Tensor, lse: torch.Tensor,
              doc_start: torch.Tensor | None, scale: float, cfg: BlockConfig, solve: dict) -> torch.Tensor:
    """The separate inverse launch, at most 4 warps (one warp group per chunk×chunk tile): at
    [2,8192,32,128] on an H200 it took 147.2 µs with 4 warps against 433.9 µs with the solves' 8 (docs/
    benchmarks.md, run 21)."""
    return diag_inverse(x, k, beta, lse, doc_start, scale=scale, chunk=cfg.chunk, dot_prec=solve["dot_prec"],
                        inv_prec=solve["inv_prec"], num_warps=min(cfg.num_warps, 4),
                        inv_split=cfg.inverse_split)


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    if device.type != "cuda":
        return None  # the CPU interpreter runs the same launches in order
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def _fused_superblocks(
    x: torch.Tensor, k: torch.Tensor, u: torch.Tensor, beta: torch.Tensor, lse: torch.Tensor,
    partial: torch.Tensor | None, linv: torch.Tensor, doc_start: torch.Tensor | None,
    blocks: list[tuple[int, int]], solve_rows: Callable[[int, int], None], scale: float, cfg: BlockConfig,
    solve: dict,
) -> None:
    """Superblock loop of the ``fused`` variant: one preparation launch, then the sequential solve, per
    superblock. With ``overlap`` the next superblock's sums over keys solved before the current superblock
    run on a side stream beside the current solve; only the current superblock's keys, the normalisers and
    the inverses are left on the critical path."""
    state = None
    if cfg.overlap and len(blocks) > 2:
        state = new_buffer(lse.shape, device=lse.device, dtype=torch.float32)
    side = _side_stream(x.device) if state is not None else None

    inverses = not (cfg.wave_inverse and cfg.wave_forward == "superblock")

    def prep(lo: int, hi: int, **kwargs) -> None:
        prep_superblock(x, k, u, beta, lse, partial, linv, doc_start, row_lo=lo, row_hi=hi, scale=scale,
                        chunk=cfg.chunk, tiles=cfg.prep, dot_prec=solve["dot_prec"],
                        inv_prec=solve["inv_prec"], inv_split=cfg.inverse_split, inverses=inverses,
                        max_registers=cfg.prep_registers, **kwargs)

    solved: list[torch.cuda.Event] = []
    prep(*blocks[0])
    for s, (lo, hi) in enumerate(blocks):
        solve_rows(lo, hi)
        if side is not None:
            solved.append(torch.cuda.Event())
            solved[-1].record(torch.cuda.current_stream(x.device))
        if s + 1 == len(blocks):
            break
        if state is None or s == 0:
            prep(*blocks[s + 1])
            continue
        if side is None:
            prep(*blocks[s + 1], val_lo=lo, state=state, finish=False)
        else:  # keys [0, lo) were solved by superblock s − 1: their sums can run beside this solve
            side.wait_event(solved[s - 1])
            with torch.cuda.stream(side):
                prep(*blocks[s + 1], val_lo=lo, state=state, finish=False)
                done = torch.cuda.Event()
                done.record(side)
            torch.cuda.current_stream(x.device).wait_event(done)
        prep(*blocks[s + 1], val_lo=lo, state=state)


def forward_pass(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, w: torch.Tensor | None,
    doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, scale: float, cfg: BlockConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """o (q's dtype), U and P·U (v's dtype), lse1 and lse2 (fp32 [B, H, T], log2 domain; lse2 is
    [B, H, 0] when w is None, as stage 2 then needs no normaliser of its own) and the diagonal-block
    inverses (fp32 [B·H, n_chunks, chunk, chunk])."""
    B, T, H, _ = q.shape
    x = q if w is None else w
    rows, _, solve = _settings(q.dtype, cfg)
    lse1 = new_buffer((B, H, T), device=q.device, dtype=torch.float32)
    if cfg.wave_forward == "full":
        return _wave_forward_pass(q, k, v, beta, w, doc_start, lse1, scale, cfg)
    if cfg.fused_prep:
        linv = new_buffer((B * H, -(-T // cfg.chunk), cfg.chunk, cfg.chunk), device=q.device,
                          dtype=torch.float32)
    else:
        row_forward(x, k, None, lse1, None, doc_start, scale=scale, strict=True, online=True, **rows)
        linv = _inverses(x, k, beta, lse1, doc_start, scale, cfg, solve)
    u = new_buffer(v.shape, device=v.device, dtype=v.dtype)
    pu = new_buffer(v.shape, device=v.device, dtype=v.dtype)
    o = new_buffer(v.shape, device=q.device, dtype=q.dtype)
    blocks = _superblocks(T, cfg.superblock)
    partial = new_buffer(v.shape, device=v.device, dtype=torch.float32) if len(blocks) > 1 else None

    flags = superblock_flags(B * H, T, cfg.chunk, cfg.superblock, q.device) \
        if cfg.wave_forward == "superblock" else None

    def solve_rows(lo: int, hi: int) -> None:
        if flags is not None:
            warps, stages = cfg.wave_tiles[:2]
            superblock_wave_solve(x, k, v, u, pu, o if w is None else None, beta, lse1, linv,
                                  partial if lo > 0 else None, doc_start, flags, row_lo=lo, row_hi=hi,
                                  superblock=cfg.superblock, scale=scale, chunk=cfg.chunk,
                                  defer=cfg.wave_defer, dot_prec=solve["dot_prec"],
                                  inv_prec=solve["inv_prec"], num_warps=warps, num_stages=stages,
                                  build_inverse=cfg.wave_inverse and cfg.fused_prep,
                                  inv_split=cfg.inverse_split, max_registers=cfg.wave_registers)
            return
        solve_forward(x, k, v, u, pu, o if w is None else None, beta, lse1, linv, partial if lo > 0 else None,
                      doc_start, row_lo=lo, row_hi=hi, scale=scale, **solve)

    if cfg.fused_prep:
        _fused_superblocks(x, k, u, beta, lse1, partial, linv, doc_start, blocks, solve_rows, scale, cfg,
                           solve)
    else:
        for lo, hi in blocks:
            if lo > 0:
                row_forward(x, k, u, lse1, partial, doc_start, scale=scale, strict=True, online=False,
                            row_base=lo, row_count=hi - lo, keys_before_base=True, **rows)
            solve_rows(lo, hi)
    if w is None:
        return o, u, pu, lse1, lse1.new_empty((B, H, 0)), linv
    lse2 = new_buffer((B, H, T), device=q.device, dtype=torch.float32)
    row_forward(q, k, u, lse2, o, doc_start, scale=scale, strict=False, online=True, **rows)
    return o, u, pu, lse1, lse2, linv


def _wave_forward_pass(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, w: torch.Tensor | None,
    doc_start: torch.Tensor | None, lse1: torch.Tensor, scale: float, cfg: BlockConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``forward_pass`` of the ``wave`` variant: one wavefront launch, then stage 2 when w is separate."""
    B, T, H, _ = q.shape
    rows, _, solve = _settings(q.dtype, cfg)
    linv = inverse_buffer(B * H, T, cfg.chunk, q.device)
    u = new_buffer(v.shape, device=v.device, dtype=v.dtype)
    pu = new_buffer(v.shape, device=v.device, dtype=v.dtype)
    o = new_buffer(v.shape, device=q.device, dtype=q.dtype)
    warps, stages = cfg.wave_tiles[:2]
    wave_forward(q if w is None else w, k, v, u, pu, o if w is None else None, beta, lse1, linv, doc_start,
                 scale=scale, chunk=cfg.chunk, defer=cfg.wave_defer, dot_prec=solve["dot_prec"],
                 inv_prec=solve["inv_prec"], num_warps=warps, num_stages=stages, inv_split=cfg.inverse_split)
    if w is None:
        return o, u, pu, lse1, lse1.new_empty((B, H, 0)), linv
    lse2 = new_buffer((B, H, T), device=q.device, dtype=torch.float32)
    row_forward(q, k, u, lse2, o, doc_start, scale=scale, strict=False, online=True, **rows)
    return o, u, pu, lse1, lse2, linv


def backward_pass(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
    w: torch.Tensor | None, u: torch.Tensor, pu: torch.Tensor, o: torch.Tensor, lse1: torch.Tensor,
    lse2: torch.Tensor, doc_start: torch.Tensor | None, doc_end: torch.Tensor | None, scale: float,
    cfg: BlockConfig, linv: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """fp32 gradients dq, dk, dv, dβ and dw (None when w is None: then dq holds both stages).
    ``linv``: the forward's diagonal-block inverses, when kept (rebuilt here otherwise)."""
    T = q.shape[1]
    x = q if w is None else w
    rows, cols, solve = _settings(q.dtype, cfg)
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
    if cfg.wave_backward:
        warps, stages = cfg.wave_tiles[2:]
        wave_backward(x, k, src, alpha, g, y, beta, lse1, linv, doc_start, doc_end, scale=scale,
                      chunk=cfg.chunk, defer=cfg.wave_defer, dot_prec=solve["dot_prec"],
                      inv_prec=solve["inv_prec"], num_warps=warps, num_stages=stages,
                      inv_split=cfg.inverse_split)
    elif linv is None:
        linv = _inverses(x, k, beta, lse1, doc_start, scale, cfg, solve)
    partial = None
    for lo, hi in ([] if cfg.wave_backward else reversed(_superblocks(T, cfg.bwd_superblock))):
        if hi < T:
            if partial is None:
                partial = new_buffer(v.shape, **f32)
            col_backward(x, k, None, y, lse1, None, None, partial, doc_start, doc_end, scale=scale,
                         strict=True, key_base=lo, key_stop=hi, row_from=hi, **cols)
        solve_backward(x, k, src, alpha, g, y, beta, lse1, linv, partial if hi < T else None, doc_start,
                       doc_end, row_lo=lo, row_hi=hi, scale=scale, **solve)
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
