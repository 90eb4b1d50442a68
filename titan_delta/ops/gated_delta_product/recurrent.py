"""Token-by-token Gated DeltaProduct: the obvious oracle for the chunked form and the Triton kernels."""

from __future__ import annotations

import torch

from titan_delta.ops._checks import check_same_device, check_shape, check_tensor
from titan_delta.ops.gated_delta_product._driver import run_gated_delta_product
from titan_delta.ops.gated_delta_product._validate import (
    STATE_DTYPES,
    compute_dtype_of,
    resolve_scale,
    validate_gated_delta_product_args,
)


def _token_update(
    state: torch.Tensor,
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor | None,
    beta_t: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: decay the state by exp(g_t), apply its n_h delta-rule steps, read the output.

    state [N,H,K,V]; q_t [N,H,K]; k_t [N,n_h,H,K]; v_t [N,n_h,H,V]; g_t [N,H] or None; beta_t [N,n_h,H].
    Written without in-place ops so autograd sees every intermediate state.
    """
    if g_t is not None:
        state = state * g_t.exp()[..., None, None]
    for j in range(k_t.shape[1]):
        k_j, v_j, beta_j = k_t[:, j], v_t[:, j], beta_t[:, j]
        predicted = torch.einsum("nhk,nhkv->nhv", k_j, state)
        correction = beta_j[..., None] * (v_j - predicted)
        state = state + torch.einsum("nhk,nhv->nhkv", k_j, correction)
    o_t = torch.einsum("nhk,nhkv->nhv", q_t * scale, state)
    return o_t, state


def _recurrent_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    state: torch.Tensor,
    num_householder: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, H, _ = q.shape
    n_h = num_householder
    outputs = []
    for t in range(T):
        steps = slice(t * n_h, (t + 1) * n_h)
        o_t, state = _token_update(
            state, q[:, t], k[:, steps], v[:, steps], None if g is None else g[:, t], beta[:, steps], scale
        )
        outputs.append(o_t)
    if not outputs:
        return q.new_zeros(B, 0, H, v.shape[-1]), state
    return torch.stack(outputs, dim=1), state


def gated_delta_product_recurrent(
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaProduct one token at a time (same arguments and results as ``gated_delta_product``).

    Slow (a Python loop over T·n_h steps) but a line-by-line transcription of the recurrence, so it is the
    oracle every faster form is tested against. Differentiable.
    """
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
    return run_gated_delta_product(
        _recurrent_dense, q, k, v, g, beta, dims, initial_state, output_final_state, cu_seqlens
    )


def gated_delta_product_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor | None,
    beta_t: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance a decoding state by one token: returns (o_t [N,H,V] in q_t's dtype, new_state [N,H,K,V]).

    q_t [N,H,K]; k_t [N,n_h,H,K]; v_t [N,n_h,H,V]; g_t [N,H] (log gate) or None; beta_t [N,n_h,H];
    state [N,H,K,V] fp32/fp64 (zeros to start). n_h is read from k_t. The new state is fp32, or fp64 when
    an input is fp64, exactly as the recurrent form would carry it.
    """
    check_tensor("q_t", q_t, 3, "[N, H, K]")
    check_tensor("k_t", k_t, 4, "[N, num_householder, H, K]")
    check_tensor("v_t", v_t, 4, "[N, num_householder, H, V]")
    check_tensor("beta_t", beta_t, 3, "[N, num_householder, H]")
    check_tensor("state", state, 4, "[N, H, K, V]", dtypes=STATE_DTYPES)
    N, H, K = q_t.shape
    n_h, V = k_t.shape[1], v_t.shape[-1]
    if n_h < 1:
        raise ValueError(f"k_t must hold num_householder >= 1 steps in dim 1, got shape {tuple(k_t.shape)}")
    check_shape("k_t", k_t, (N, n_h, H, K), "[N, num_householder, H, K]")
    check_shape("v_t", v_t, (N, n_h, H, V), "[N, num_householder, H, V]")
    check_shape("beta_t", beta_t, (N, n_h, H), "[N, num_householder, H]")
    check_shape("state", state, (N, H, K, V), "[N, H, K, V]")
    if g_t is not None:
        check_tensor("g_t", g_t, 2, "[N, H]")
        check_shape("g_t", g_t, (N, H), "[N, H]")
    check_same_device(q_t=q_t, k_t=k_t, v_t=v_t, g_t=g_t, beta_t=beta_t, state=state)
    dt = compute_dtype_of(q_t, k_t, v_t, g_t, beta_t, state)
    o_t, new_state = _token_update(
        state.to(dt),
        q_t.to(dt),
        k_t.to(dt),
        v_t.to(dt),
        None if g_t is None else g_t.to(dt),
        beta_t.to(dt),
        resolve_scale(scale, K),
    )
    return o_t.to(q_t.dtype), new_state
