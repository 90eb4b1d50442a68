"""The stage-1 kernels κ1 of DeltaFormer, applied to already-scaled scores s = scale · (w_t · k_i).

The scale is applied to the score *before* κ1 in every variant, so ``kernel="linear"`` computes
``scale · w·k`` and ``kernel="exp"`` computes ``exp(scale · w·k)``. ``"softmax"`` is the only variant that
needs the whole row: it is normalised over the strictly-causal keys of the same document (i < t).
``"round"`` rounds to two decimals; rounding is piecewise constant, so no gradient flows through it
(w and k then get gradient only from stage 2).
"""

from __future__ import annotations

import torch

KERNELS = ("softmax", "linear", "relu", "round", "exp")

# Rows with no allowed key (t = 0, the first token of a document) have an empty normaliser; clamping the
# sum to this floor keeps log() finite so those rows give κ = 0 with finite gradients, never NaN.
_EMPTY_ROW_FLOOR = 1e-30


def check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def elementwise_kappa(scores: torch.Tensor, kernel: str) -> torch.Tensor:
    """κ1 for the variants that act on each score alone (everything except ``"softmax"``)."""
    if kernel == "linear":
        return scores
    if kernel == "relu":
        return torch.relu(scores)
    if kernel == "round":
        # torch.round has a zero derivative everywhere, which is exactly the documented behaviour.
        return torch.round(scores * 100.0) / 100.0
    if kernel == "exp":
        return torch.exp(scores)
    raise ValueError(f"elementwise_kappa has no rule for kernel {kernel!r} (softmax needs a row normaliser)")


def masked_kappa(scores: torch.Tensor, allowed: torch.Tensor, kernel: str) -> torch.Tensor:
    """κ1 over score rows whose entries outside ``allowed`` (a broadcastable bool mask) count as absent.

    Absent entries come out exactly 0 and receive zero gradient. For ``"softmax"`` each row is normalised
    over its allowed entries only; a row with none is all zeros (not NaN).
    """
    if kernel != "softmax":
        # Mask the score first, so exp() of an absent (possibly huge) score cannot overflow into inf·0.
        safe = scores.masked_fill(~allowed, 0.0)
        return elementwise_kappa(safe, kernel).masked_fill(~allowed, 0.0)
    masked = scores.masked_fill(~allowed, float("-inf"))
    return torch.exp(masked - row_log_normaliser(masked))


def row_log_normaliser(masked_scores: torch.Tensor) -> torch.Tensor:
    """log Σ_i exp(s_i) over the last dim, where absent entries are -inf; finite even for empty rows.

    Written out instead of torch.logsumexp because logsumexp's backward evaluates exp(-inf − (-inf)) = NaN
    on an all-absent row, which would poison the gradient even though that row contributes nothing.
    """
    row_max = masked_scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    total = torch.exp(masked_scores - row_max).sum(dim=-1, keepdim=True)
    return row_max + torch.log(total.clamp_min(_EMPTY_ROW_FLOOR))
