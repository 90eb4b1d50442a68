"""Shared inputs and checks of the Gated DeltaProduct kernel tests (kernel vs the fp64 recurrent oracle)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from titan_delta.ops.gated_delta_product.reference import gated_delta_product_recurrent
from titan_delta.testing import assert_rel_close
from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

NAMES = ("q", "k", "v", "g", "beta", "initial_state")
FP32_TOL = (1e-5, 1e-5, 1e-5)  # CPU interpreter, fp32 inputs: (o and final state, dq dk dv dS₀, dg dβ)
FP16_TOL = (5e-3, 1e-2, 2e-2)  # CPU interpreter, fp16 inputs (the 16-bit storage path)
BF16_TOL = (5e-3, 1e-2, 2e-2)  # GPU, bf16 inputs
FP32_GPU_TOL = (1e-4, 1e-4, 1e-4)  # GPU, fp32 inputs (tf32x3 products)


def make_inputs(B, T, H, K, V, n_h, *, gated=True, num_seqs=None, dtype=torch.float32, device="cpu",
                gate_range=(-1.0, 0.0)):  # fmt: skip
    """Fresh inputs: unit-norm keys, β ∈ (0, 2), log gates drawn uniformly in ``gate_range``."""
    N = B if num_seqs is None else num_seqs
    lo, hi = gate_range
    return dict(
        q=torch.randn(B, T, H, K, device=device).to(dtype),
        k=F.normalize(torch.randn(B, T * n_h, H, K, device=device), dim=-1).to(dtype),
        v=torch.randn(B, T * n_h, H, V, device=device).to(dtype),
        g=(torch.rand(B, T, H, device=device) * (hi - lo) + lo) if gated else None,
        beta=torch.rand(B, T * n_h, H, device=device) * 1.98 + 0.01,
        initial_state=torch.randn(N, H, K, V, device=device),
    )


def random_cu_seqlens(T: int, n: int, device="cpu") -> torch.Tensor:
    """n documents summing to T tokens (one may be empty)."""
    cuts = torch.sort(torch.randint(0, T + 1, (n - 1,))).values
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(device=device, dtype=torch.int32)


def run_with_grads(fn, inputs, n_h, cu_seqlens, d_out, d_final, dtype=None):
    """Runs ``fn`` with the inputs (cast to ``dtype`` when given) and returns (o, S, grads by name)."""
    def leaf(x):
        return None if x is None else x.detach().to(dtype or x.dtype).requires_grad_()

    leaves = {n: leaf(x) for n, x in inputs.items()}
    o, final = fn(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], num_householder=n_h,
        initial_state=leaves["initial_state"], output_final_state=True, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    loss = (o.to(d_out.dtype) * d_out).sum() + (final.to(d_final.dtype) * d_final).sum()
    names = [n for n, x in leaves.items() if x is not None]
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])
    return o, final, dict(zip(names, grads, strict=True))


def check_against_reference(inputs, n_h, cu_seqlens, tol_out, tol_grad, tol_gate_grad, dg_floor=0.0,
                            kernel=gated_delta_product_triton):  # fmt: skip
    """Kernel vs fp64 recurrent oracle on the same inputs. ``dg_floor``: extra absolute allowance on dg as
    a fraction of ‖dβ‖, for gates so close to 0 that the true dg (~e^{-30}) is below bf16 noise."""
    q = inputs["q"]
    d_out = torch.randn(*q.shape[:3], inputs["v"].shape[-1], device=q.device, dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    o, final, grads = run_with_grads(kernel, inputs, n_h, cu_seqlens, d_out, d_final)
    ro, rfinal, rgrads = run_with_grads(
        gated_delta_product_recurrent, inputs, n_h, cu_seqlens, d_out, d_final, torch.float64
    )
    assert o.dtype == q.dtype and final.dtype == torch.float32
    assert_rel_close(o, ro, tol_out, "o")
    assert_rel_close(final, rfinal, tol_out, "final_state")
    for name, grad in grads.items():
        tol = tol_gate_grad if name in ("g", "beta") else tol_grad
        if name == "g" and dg_floor > 0:
            err = (grad.double() - rgrads["g"]).norm().item()
            allowed = tol * rgrads["g"].norm().item() + dg_floor * rgrads["beta"].norm().item()
            assert torch.isfinite(grad).all() and err <= allowed, f"dg: error {err:.3e} > {allowed:.3e}"
            continue
        assert_rel_close(grad, rgrads[name], tol, f"d{name}")


@contextmanager
def launches():
    """Records (kernel name, keyword arguments) of every GDP kernel launch inside the block."""
    log: list[tuple[str, dict]] = []
    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("titan_delta_kernels.gated_delta_product") and hasattr(module, "launch"):
            original = module.launch

            def record(kernel, grid, *args, _original=original, **kwargs):
                log.append((getattr(kernel, "fn", kernel).__name__, kwargs))
                return _original(kernel, grid, *args, **kwargs)

            patched.append((module, original))
            module.launch = record
    try:
        yield log
    finally:
        for module, original in patched:
            module.launch = original
