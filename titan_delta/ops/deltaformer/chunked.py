"""Chunk-wise DeltaFormer (the paper's algorithm), vectorised over batch and heads; the torch backend.

Stage 1 is the unit lower-triangular system (I + diag(β) P) U = V, P[t, i] = κ1(w_t, k_i) for i < t in
the same document. It is solved one chunk of rows at a time: the rows of chunk c first take the
contribution of every earlier, already-solved chunk in one matmul, then a small triangular solve inside
the chunk finishes them. For κ1 = softmax the row normalisers depend only on w and k (not on U), so each
chunk computes them from its full row of scores before solving: P stays a fixed matrix. Stage 2 is plain
causal softmax attention over U, also one chunk of query rows at a time, so memory is O(chunk · T).
Documents packed with ``cu_seqlens`` are kept apart by masks, in both stages.
"""

from __future__ import annotations

import torch

from titan_delta.ops.deltaformer.inputs import DeltaFormerInputs, prepare_inputs
from titan_delta.ops.deltaformer.kappa import masked_kappa


def _allowed(
    row_start: int,
    row_end: int,
    col_end: int,
    segments: torch.Tensor | None,
    strict: bool,
    device: torch.device,
) -> torch.Tensor:
    """Bool [rows, cols]: key i may enter row t (i < t, or i ≤ t if not strict, and the same document)."""
    rows = torch.arange(row_start, row_end, device=device)[:, None]
    cols = torch.arange(col_end, device=device)[None, :]
    allowed = cols < rows if strict else cols <= rows
    if segments is not None:
        allowed = allowed & (segments[row_start:row_end, None] == segments[None, :col_end])
    return allowed


def _check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _stage1(x: DeltaFormerInputs, chunk_size: int) -> torch.Tensor:
    """U in layout [B,H,T,Dv], solved chunk by chunk."""
    w, k, v = (t.transpose(1, 2) for t in (x.w, x.k, x.v))  # [B,H,T,*]
    beta = x.beta.transpose(1, 2)[..., None]  # [B,H,T,1]
    segments = x.segment_ids()
    solved: list[torch.Tensor] = []
    for start in range(0, x.seq_len, chunk_size):
        end = min(start + chunk_size, x.seq_len)
        scores = torch.einsum("bhtd,bhid->bhti", w[:, :, start:end], k[:, :, :end]) * x.scale
        allowed = _allowed(start, end, end, segments, strict=True, device=w.device)
        kappa = masked_kappa(scores, allowed, x.kernel)  # [B,H,c,end]: the chunk's full rows of P
        rhs = v[:, :, start:end]
        if start > 0:  # every earlier chunk at once
            earlier_u = torch.cat(solved, dim=2)
            rhs = rhs - beta[:, :, start:end] * (kappa[..., :start] @ earlier_u)
        in_chunk = beta[:, :, start:end] * kappa[..., start:end]  # strictly lower triangular
        eye = torch.eye(end - start, dtype=in_chunk.dtype, device=in_chunk.device)
        solved.append(torch.linalg.solve_triangular(eye + in_chunk, rhs, upper=False, unitriangular=True))
    return torch.cat(solved, dim=2)


def _stage2(x: DeltaFormerInputs, u: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """o in layout [B,T,H,Dv] from U [B,H,T,Dv]: causal softmax attention, one chunk of queries at a time."""
    q, k = x.q.transpose(1, 2), x.k.transpose(1, 2)
    segments = x.segment_ids()
    outputs = []
    for start in range(0, x.seq_len, chunk_size):
        end = min(start + chunk_size, x.seq_len)
        scores = torch.einsum("bhtd,bhid->bhti", q[:, :, start:end], k[:, :, :end]) * x.scale
        allowed = _allowed(start, end, end, segments, strict=False, device=q.device)
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)  # i = t always allowed
        outputs.append(probs @ u[:, :, :end])
    return torch.cat(outputs, dim=2).transpose(1, 2)


def deltaformer_stage1_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None = None,
    *,
    w: torch.Tensor | None = None,
    kernel: str = "softmax",
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Stage-1 output U [B,T,H,Dv] in the compute dtype (fp32, or fp64 for fp64 inputs)."""
    _check_chunk_size(chunk_size)
    x = prepare_inputs(q, k, v, beta, w, kernel, cu_seqlens, scale)
    if x.seq_len == 0:
        return x.v.clone()
    return _stage1(x, chunk_size).transpose(1, 2)


def deltaformer_attn_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None = None,
    *,
    w: torch.Tensor | None = None,
    kernel: str = "softmax",
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
) -> torch.Tensor:
    """DeltaFormer output o [B,T,H,Dv] in q's dtype, chunk by chunk (see ``deltaformer_attn``)."""
    _check_chunk_size(chunk_size)
    x = prepare_inputs(q, k, v, beta, w, kernel, cu_seqlens, scale)
    if x.seq_len == 0:
        return x.v.to(x.out_dtype).clone()
    return _stage2(x, _stage1(x, chunk_size), chunk_size).to(x.out_dtype)
