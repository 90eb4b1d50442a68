"""Token-by-token DeltaFormer: the obviously-correct oracle that the chunked form and kernels are tested on.

Every position is computed straight from the definition, with plain Python loops over t; autograd
differentiates it. It is O(T²) time and slow — meant for tests on short sequences, not training.
"""

from __future__ import annotations

import torch

from titan_delta.ops.deltaformer.inputs import DeltaFormerInputs, prepare_inputs
from titan_delta.ops.deltaformer.kappa import elementwise_kappa


def _stage1(x: DeltaFormerInputs) -> torch.Tensor:
    """u_t = v_t − β_t Σ_{start(t) ≤ i < t} κ1(w_t, k_i) u_i, one t at a time."""
    doc_start = x.doc_start_of_each_token()
    rows: list[torch.Tensor] = []
    for t in range(x.seq_len):
        start = doc_start[t]
        if t == start:  # nothing earlier in this document: the sum is empty
            rows.append(x.v[:, t])
            continue
        scores = torch.einsum("bhd,bihd->bhi", x.w[:, t], x.k[:, start:t]) * x.scale
        if x.kernel == "softmax":
            kappa = torch.softmax(scores, dim=-1)
        else:
            kappa = elementwise_kappa(scores, x.kernel)
        earlier_u = torch.stack(rows[start:t], dim=1)  # [B, t-start, H, Dv]
        correction = torch.einsum("bhi,bihe->bhe", kappa, earlier_u)
        rows.append(x.v[:, t] - x.beta[:, t, :, None] * correction)
    return torch.stack(rows, dim=1)


def _stage2(x: DeltaFormerInputs, u: torch.Tensor) -> torch.Tensor:
    """o_t = Σ_{start(t) ≤ i ≤ t} softmax_i(scale · q_t·k_i) u_i — note i = t is included here."""
    doc_start = x.doc_start_of_each_token()
    rows = []
    for t in range(x.seq_len):
        start = doc_start[t]
        scores = torch.einsum("bhd,bihd->bhi", x.q[:, t], x.k[:, start : t + 1]) * x.scale
        rows.append(torch.einsum("bhi,bihe->bhe", torch.softmax(scores, dim=-1), u[:, start : t + 1]))
    return torch.stack(rows, dim=1)


def deltaformer_stage1_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None = None,
    *,
    w: torch.Tensor | None = None,
    kernel: str = "softmax",
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Stage-1 output U [B,T,H,Dv] in the compute dtype (fp32, or fp64 for fp64 inputs)."""
    x = prepare_inputs(q, k, v, beta, w, kernel, cu_seqlens, scale)
    if x.seq_len == 0:
        return x.v.clone()
    return _stage1(x)


def deltaformer_attn_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None = None,
    *,
    w: torch.Tensor | None = None,
    kernel: str = "softmax",
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """DeltaFormer output o [B,T,H,Dv] in q's dtype, computed token by token (see ``deltaformer_attn``)."""
    x = prepare_inputs(q, k, v, beta, w, kernel, cu_seqlens, scale)
    if x.seq_len == 0:
        return x.v.to(x.out_dtype).clone()
    return _stage2(x, _stage1(x)).to(x.out_dtype)
