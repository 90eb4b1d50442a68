"""Inputs shared by the Gated DeltaProduct op tests (reference and value pieces)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def make_inputs(
    B: int = 2,
    T: int = 11,
    H: int = 2,
    K: int = 8,
    V: int = 6,
    n_h: int = 2,
    *,
    gated: bool = True,
    dtype: torch.dtype = torch.float64,
    log_gate: float | None = None,
) -> dict[str, torch.Tensor | None]:
    """Fresh inputs as the layer produces them: unit-norm keys, β ∈ (0, 2), log-sigmoid gates."""
    q = torch.randn(B, T, H, K, dtype=dtype)
    k = F.normalize(torch.randn(B, T * n_h, H, K, dtype=dtype), dim=-1)
    v = torch.randn(B, T * n_h, H, V, dtype=dtype)
    beta = 2 * torch.rand(B, T * n_h, H, dtype=dtype)
    if not gated:
        g = None
    elif log_gate is None:
        g = F.logsigmoid(torch.randn(B, T, H, dtype=dtype) + 2)
    else:
        g = torch.full((B, T, H), log_gate, dtype=dtype)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}


def split_tokens(x: dict, cut: int, n_h: int) -> tuple[dict, dict]:
    """Inputs of tokens [0, cut) and [cut, T): per-step tensors are cut at cut·n_h."""

    def at(name: str) -> int:
        return cut * n_h if name in ("k", "v", "beta") else cut

    first = {n: None if t is None else t[:, : at(n)] for n, t in x.items()}
    second = {n: None if t is None else t[:, at(n) :] for n, t in x.items()}
    return first, second


def initial_state_for(x: dict, N: int | None = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    _, _, H, K = x["q"].shape
    N = x["q"].shape[0] if N is None else N
    return torch.randn(N, H, K, x["v"].shape[-1], dtype=dtype)
