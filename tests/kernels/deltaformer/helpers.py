"""Inputs, gradients and comparisons shared by the DeltaFormer kernel tests."""

from __future__ import annotations

import torch

from titan_delta.ops.deltaformer.reference import deltaformer_attn_chunked, deltaformer_attn_recurrent
from titan_delta.testing import rel_rms_error
from titan_delta_kernels.deltaformer import deltaformer_attn_triton

GRAD_NAMES = ("dq", "dk", "dv", "dbeta", "dw")


def make_inputs(B, T, H, D, Dv, *, separate_w, dtype, device, beta_max=1.0):
    """q, k, v, beta, w (None unless ``separate_w``)."""
    def rand(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)

    q, k, v = rand(B, T, H, D), rand(B, T, H, D), rand(B, T, H, Dv)
    w = rand(B, T, H, D) if separate_w else None
    beta = (torch.rand(B, T, H, device=device) * beta_max).to(dtype)
    return q, k, v, beta, w


def grads(fn, inputs, d_out):
    """Output and gradients of ``fn(*inputs)`` (None inputs skipped) for cotangent ``d_out``."""
    leaves = [None if x is None else x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    used = [x for x in leaves if x is not None]
    got = torch.autograd.grad(out, used, d_out, allow_unused=True)
    return out, [torch.zeros_like(x) if g is None else g for x, g in zip(used, got, strict=True)]


def compare(ours, ours_grads, ref, ref_grads, tol_out, tol_grad) -> dict[str, float]:
    """Relative RMS errors of o and every gradient; asserts them against the tolerances."""
    errors = {"o": rel_rms_error(ours, ref)}
    errors.update({n: rel_rms_error(a, b)
                   for n, a, b in zip(GRAD_NAMES, ours_grads, ref_grads, strict=False)})
    assert errors["o"] <= tol_out, errors
    assert all(e <= tol_grad for n, e in errors.items() if n != "o"), errors
    return errors


def check_against_oracle(B, T, H, D, Dv, separate_w, cu) -> None:
    """fp32 kernels vs the fp64 token-by-token oracle: output and every gradient."""
    q, k, v, beta, w = make_inputs(B, T, H, D, Dv, separate_w=separate_w, dtype=torch.float64, device="cpu")
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    scale = 0.37
    d_out = torch.randn(B, T, H, Dv, dtype=torch.float64)
    inputs = [q, k, v, beta, w]

    def reference(q, k, v, beta, w):
        return deltaformer_attn_recurrent(q, k, v, beta, w=w, scale=scale, cu_seqlens=cu_seqlens)

    def kernel(q, k, v, beta, w):
        return deltaformer_attn_triton(q, k, v, beta, w=w, scale=scale, cu_seqlens=cu_seqlens)

    ref, ref_grads = grads(reference, inputs, d_out)
    ours, ours_grads = grads(kernel, [None if x is None else x.float() for x in inputs], d_out.float())
    assert ours.dtype == torch.float32
    compare(ours, ours_grads, ref, ref_grads, tol_out=2e-5, tol_grad=5e-5)


def gpu_check(B, T, H, D, *, separate_w, dtype, cu=None, tol_out=6e-3, tol_grad=1e-2, Dv=None,
              ref_dtype=torch.float32) -> dict[str, float]:
    """The kernels on CUDA against the chunk-wise reference in ``ref_dtype``; returns the errors."""
    Dv = D if Dv is None else Dv
    q, k, v, beta, w = make_inputs(B, T, H, D, Dv, separate_w=separate_w, dtype=dtype, device="cuda")
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32, device="cuda")
    scale = D**-0.5
    d_out = torch.randn(B, T, H, Dv, device="cuda", dtype=dtype)
    inputs = [q, k, v, beta, w]

    def kernel(q, k, v, beta, w):
        return deltaformer_attn_triton(q, k, v, beta, w=w, scale=scale, cu_seqlens=cu_seqlens)

    def reference(q, k, v, beta, w):
        return deltaformer_attn_chunked(q, k, v, beta, w=w, scale=scale, cu_seqlens=cu_seqlens)

    ours, ours_grads = grads(kernel, inputs, d_out)
    ref, ref_grads = grads(reference, [None if x is None else x.to(ref_dtype) for x in inputs],
                           d_out.to(ref_dtype))
    assert ours.dtype == dtype
    return compare(ours, ours_grads, ref, ref_grads, tol_out, tol_grad)


def describe(errors: dict[str, float]) -> str:
    return ", ".join(f"{n} {e:.2e}" for n, e in errors.items())
