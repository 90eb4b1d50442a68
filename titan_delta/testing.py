"""Numerical helpers for comparing kernels with their references (used by tests and GPU proofs)."""

from __future__ import annotations

import torch


def rel_rms_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖₂ / ‖expected‖₂ in float64; NaN/Inf anywhere gives +inf so it never passes."""
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    if a.shape != e.shape:
        raise ValueError(f"shape mismatch: {tuple(a.shape)} vs {tuple(e.shape)}")
    if not torch.isfinite(a).all():
        return float("inf")
    denom = e.norm().item()
    num = (a - e).norm().item()
    return num / denom if denom > 0 else num


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, name: str = "value") -> None:
    err = rel_rms_error(actual, expected)
    assert err <= tol, f"{name}: relative RMS error {err:.3e} > {tol:.1e}"


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so any element a kernel forgets to write shows up in the comparison."""
    return t.fill_(float("nan"))
