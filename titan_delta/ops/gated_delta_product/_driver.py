"""Shared plumbing of the two references: upcast to the math dtype, split packed documents, cast back."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import torch

from titan_delta.ops.gated_delta_product._validate import GDPDims

# A dense solver: (q, k, v, g, beta, state, num_householder, scale) -> (o, final_state), every tensor in the
# math dtype, batched over B, without cu_seqlens.
DenseSolver = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, int, float],
    tuple[torch.Tensor, torch.Tensor],
]


def run_gated_delta_product(
    dense_solver: DenseSolver,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    dims: GDPDims,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``dense_solver`` on the whole batch, or once per document when ``cu_seqlens`` packs them.

    Per-document calls keep the references obviously right: a state can never leak across a boundary.
    """
    dt = dims.compute_dtype
    n_h = dims.num_householder
    qc, kc, vc, bc = (x.to(dt) for x in (q, k, v, beta))
    gc = None if g is None else g.to(dt)
    if initial_state is None:
        shape = (dims.num_sequences, dims.heads, dims.key_dim, dims.value_dim)
        state = torch.zeros(shape, dtype=dt, device=q.device)
    else:
        state = initial_state.to(dt)

    if cu_seqlens is None:
        o, final_state = dense_solver(qc, kc, vc, gc, bc, state, n_h, dims.scale)
    else:
        outputs, finals = [], []
        for i, (start, end) in enumerate(pairwise(cu_seqlens.tolist())):
            steps = slice(start * n_h, end * n_h)
            o_i, final_i = dense_solver(
                qc[:, start:end],
                kc[:, steps],
                vc[:, steps],
                None if gc is None else gc[:, start:end],
                bc[:, steps],
                state[i : i + 1],
                n_h,
                dims.scale,
            )
            outputs.append(o_i)
            finals.append(final_i)
        o = torch.cat(outputs, dim=1)
        final_state = torch.cat(finals, dim=0)
    return o.to(q.dtype), (final_state if output_final_state else None)
