"""Chunked Gated DeltaProduct: the WY/UT form of the gated delta rule on the interleaved step sequence.

Derivation (positions i = 0..C-1 of one chunk of the interleaved sequence, state S_0 [K,V] entering it,
a_i the log gate of step i: g_t at i = t·n_h, 0 elsewhere; b_i = Σ_{j≤i} a_j within the chunk).
The step S_i = e^{a_i} S_{i-1} + β_i k_i (v_i − e^{a_i} S_{i-1}ᵀ k_i)ᵀ reads S_i = e^{a_i} S_{i-1} + k_i δ_iᵀ,
    δ_i = β_i (v_i − e^{a_i} S_{i-1}ᵀ k_i),   so   S_i = e^{b_i} S_0 + Σ_{j≤i} e^{b_i−b_j} k_j δ_jᵀ.
Substituting S_{i-1} gives the unit-lower-triangular system (I + L) δ = diag(β) V − diag(β e^{b}) K S_0,
    L_ij = β_i e^{b_i−b_j} k_iᵀk_j  (j < i),
hence δ = U − W S_0 with U = (I+L)⁻¹ diag(β) V and W = (I+L)⁻¹ diag(β e^{b}) K (the UT transform). Then
    o_i = S_iᵀ q_i = e^{b_i} q_iᵀ S_0 + Σ_{j≤i} e^{b_i−b_j} (q_iᵀ k_j) δ_j,
    S_C = e^{b_C} S_0 + Σ_j e^{b_C−b_j} k_j δ_jᵀ.
Every exponent above is a difference b_i − b_j with j ≤ i or a prefix b_i, so with g ≤ 0 it is ≤ 0: gates
near 0 (g = −30) underflow to exact zeros and gates near 1 give ones, never inf/inf.
Queries sit at each token's last step (zeros elsewhere) so outputs are read after all n_h steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from titan_delta.ops.gated_delta_product._driver import run_gated_delta_product
from titan_delta.ops.gated_delta_product._validate import validate_gated_delta_product_args


def _interleave(
    q: torch.Tensor, g: torch.Tensor | None, num_householder: int, scale: float, steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per interleaved step: the scaled query (only at a token's last step) and the log gate (first step)."""
    B, T, H, K = q.shape
    n_h = num_householder
    q_steps = torch.cat([q.new_zeros(B, T, n_h - 1, H, K), (q * scale)[:, :, None]], dim=2)
    if g is None:
        log_gate = q.new_zeros(B, steps, H)
    else:
        log_gate = torch.cat([g[:, :, None], g.new_zeros(B, T, n_h - 1, H)], dim=2).reshape(B, steps, H)
    return q_steps.reshape(B, steps, H, K), log_gate


def _to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B, L, H, *D] -> [B, H, num_chunks, C, *D], zero-padded at the end (β = 0 steps change nothing)."""
    x = x.movedim(2, 1)
    pad = (-x.shape[2]) % chunk_size
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    return x.reshape(*x.shape[:2], -1, chunk_size, *x.shape[3:])


def _chunked_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    state: torch.Tensor,
    num_householder: int,
    scale: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, H, _ = q.shape
    V, n_h, steps = v.shape[-1], num_householder, k.shape[1]
    if T == 0:
        return q.new_zeros(B, 0, H, V), state
    q_steps, log_gate = _interleave(q, g, n_h, scale, steps)
    q_c, k_c, v_c = (_to_chunks(x, chunk_size) for x in (q_steps, k, v))
    beta_c, b = (_to_chunks(x[..., None], chunk_size)[..., 0] for x in (beta, log_gate))
    b = b.cumsum(dim=-1)  # [B, H, n, C] cumulative log gate within each chunk

    C = chunk_size
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strictly_lower = causal.tril(-1)
    exponent = torch.where(causal, b[..., :, None] - b[..., None, :], float("-inf"))
    decay = exponent.exp()  # e^{b_i − b_j} for j ≤ i, exact 0 above the diagonal

    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    lower = beta_c[..., None] * (k_c @ k_c.transpose(-1, -2)) * decay * strictly_lower
    unit_lower = lower + eye
    U = torch.linalg.solve_triangular(unit_lower, beta_c[..., None] * v_c, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(
        unit_lower, (beta_c * b.exp())[..., None] * k_c, upper=False, unitriangular=True
    )
    intra = (q_c @ k_c.transpose(-1, -2)) * decay  # [B, H, n, C, C]
    q_decayed = q_c * b.exp()[..., None]
    k_to_end = k_c * (b[..., -1:] - b).exp()[..., None]
    chunk_decay = b[..., -1].exp()[..., None, None]  # [B, H, n, 1, 1]

    outputs = []
    for c in range(q_c.shape[2]):
        delta = U[:, :, c] - W[:, :, c] @ state
        outputs.append(q_decayed[:, :, c] @ state + intra[:, :, c] @ delta)
        state = chunk_decay[:, :, c] * state + k_to_end[:, :, c].transpose(-1, -2) @ delta
    o_steps = torch.cat(outputs, dim=2)[:, :, :steps]  # [B, H, T*n_h, V]
    o = o_steps.reshape(B, H, T, n_h, V)[:, :, :, -1].movedim(1, 2)
    return o, state


def gated_delta_product_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    *,
    num_householder: int,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaProduct in chunks of ``chunk_size`` interleaved steps (same contract as the public op).

    Vectorised over batch, heads and chunks except for the sequential state hand-off between chunks;
    T·n_h need not be a multiple of ``chunk_size``. Differentiable (autograd through the triangular solves).
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1 (interleaved steps per chunk), got {chunk_size!r}")
    dims = validate_gated_delta_product_args(
        q,
        k,
        v,
        g,
        beta,
        num_householder=num_householder,
        scale=scale,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )

    def solver(q, k, v, g, beta, state, n_h, scale):
        return _chunked_dense(q, k, v, g, beta, state, n_h, scale, chunk_size)

    return run_gated_delta_product(
        solver, q, k, v, g, beta, dims, initial_state, output_final_state, cu_seqlens
    )
