"""``wyhoist``: the UT-transform backward for one K slice and one V tile with every load issued first
(``wy_bwd_hoisted.py``).

CPU (interpreter): the hoisted kernel's dk, dv, dg and dβ are bitwise the sliced kernel's (it runs the same
products on the same operands; only the load order differs), allocations NaN-poisoned: on fp32 inputs for
n_h = 1..4, odd T (a partial chunk), documents (one empty, one shorter than a chunk), without the gate, dk's
rows as the ∂L/∂A scratch (K = BT = 64) or a buffer of its own (K < BT); and at the default op's own call on
fp16 inputs (16-bit T, δ, ∂L/∂δ, ∂L/∂W, direct dk). The sliced kernel wherever K or V needs more than one
tile; end to end against the fp64 oracle. GPU: the default op's own call in bf16 (within bf16 last-bit
flips), bf16 at the issue's tolerances, varlen and gate extremes at K = 64.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product import grads_sliced
from titan_delta_kernels.gated_delta_product.options import parse_options

from .test_gated_delta_product_fast import ISSUE_TOL, check_gpu_bf16, variant_kernel
from .test_gated_delta_product_sliced import backward_inputs
from .test_gated_delta_product_triton import check_against_reference, make_inputs
from .test_gated_delta_product_variants import poisoned_allocations

HOIST = "default+wyhoist"
FP16_TOL = (5e-3, 1e-2, 2e-2)


def wy_bwd_both(monkeypatch: pytest.MonkeyPatch, n_h: int, T: int, K: int, V: int, cu: list[int] | None,
                gated: bool = True) -> list[tuple]:  # fmt: skip
    """(sliced, hoisted) outputs of ``grads_sliced.wy_bwd`` on one set of fresh fp32 backward inputs, every
    allocation of both calls NaN-poisoned."""
    args, geo, seqs = backward_inputs(n_h, T, K, V, cu, gated)
    q, k, v, g, beta, t_inv, v_new, states, d_states, d_delta, d_out, scale = args
    _dq, dk_part, dw, dG_step, dG_tok = grads_sliced.dqkw(q, k, g, v_new, states, d_states, d_delta, d_out,
                                                         scale, geo, seqs)  # fmt: skip
    outs = []
    for hoisted in (False, True):
        with poisoned_allocations(monkeypatch):
            outs.append(grads_sliced.wy_bwd(k, v, g, beta, t_inv, d_delta, dk_part, dw, dG_step, dG_tok, geo,
                                            seqs, hoisted=hoisted))  # fmt: skip
    return outs


def compare_at_the_default_paths_call(monkeypatch: pytest.MonkeyPatch, inputs: dict, n_h: int,
                                      cu: torch.Tensor | None, tol: float) -> list[str]:  # fmt: skip
    """Runs the default op forward and backward; at its own call of wy_bwd (the dtypes and layouts of
    training) both kernels run on the same arguments, allocations NaN-poisoned, and the hoisted one's
    outputs must equal the sliced one's (``tol`` 0) or lie within ``tol`` relative RMS of them. Returns the
    dtype of k at each compared call."""
    real = grads_sliced.wy_bwd
    compared = []

    def both(*args, **kwargs):
        with poisoned_allocations(monkeypatch):
            sliced = real(*args, **{**kwargs, "hoisted": False})
            hoisted = real(*args, **{**kwargs, "hoisted": True})
        for name, a, b in zip(("dk", "dv", "dg", "dbeta"), hoisted, sliced, strict=True):
            if b is None:
                assert a is None, name
                continue
            assert torch.isfinite(a).all(), name
            if tol == 0:
                assert torch.equal(a, b), name
            else:
                err = ((a.double() - b.double()).norm() / b.double().norm()).item()
                assert err < tol, (name, err)
        compared.append(str(args[0].dtype))
        return sliced

    monkeypatch.setattr(grads_sliced, "wy_bwd", both)
    leaves = [inputs[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
    o, _ = variant_kernel("default")(*leaves, num_householder=n_h, cu_seqlens=cu)
    o.backward(torch.randn_like(o))
    return compared


# (n_h, T, K, V, cu_seqlens, gated): several chunks at n_h = 1 with K = BT = 64 (dk's rows as the
# scratch); an odd T at n_h = 2 without the gate; documents at n_h = 3 (one empty, one shorter than a chunk)
# with K < BT; n_h = 4 with V < K.
CASES = [
    (1, 70, 64, 32, None, True),
    (2, 37, 32, 64, None, False),
    (3, 50, 16, 16, [0, 5, 5, 50], True),
    (4, 19, 64, 16, None, True),
]


@pytest.mark.parametrize(("n_h", "T", "K", "V", "cu", "gated"), CASES)
def test_hoisted_is_bitwise_the_sliced_kernel(n_h, T, K, V, cu, gated, monkeypatch):
    sliced, hoisted = wy_bwd_both(monkeypatch, n_h, T, K, V, cu, gated)
    for name, a, b in zip(("dk", "dv", "dg", "dbeta"), hoisted, sliced, strict=True):
        if b is None:
            assert a is None and not gated
            continue
        assert torch.isfinite(a).all(), name
        assert torch.equal(a, b), name


def test_hoisted_bitwise_on_the_default_paths_inputs(monkeypatch):
    """fp16 inputs through the whole default op (16-bit T, δ, ∂L/∂δ, ∂L/∂W and direct dk, as in training): the
    hoisted kernel gives the sliced kernel's outputs bitwise (n_h = 3, two documents, one shorter than a
    chunk)."""
    cu = torch.tensor([0, 14, 45], dtype=torch.int32)
    inputs = make_inputs(1, 45, 2, 64, 64, 3, num_seqs=2, dtype=torch.float16)
    assert compare_at_the_default_paths_call(monkeypatch, inputs, 3, cu, tol=0) == ["torch.float16"]


def test_hoisted_only_for_one_tile(monkeypatch):
    """K or V above one tile (64), or the flag off: the sliced kernel."""
    launched = []
    real = grads_sliced.launch
    monkeypatch.setattr(grads_sliced, "launch", lambda kernel, *a, **k: launched.append(kernel.fn.__name__)
                        or real(kernel, *a, **k))  # fmt: skip
    for K, V, hoisted in [(64, 64, True), (128, 16, True), (16, 128, True), (64, 64, False)]:
        args, geo, seqs = backward_inputs(2, 9, K, V, None, True, H=1)
        q, k, v, g, beta, t_inv, v_new, states, d_states, d_delta, d_out, scale = args
        _dq, dk_part, dw, dG_step, dG_tok = grads_sliced.dqkw(q, k, g, v_new, states, d_states, d_delta,
                                                              d_out, scale, geo, seqs)  # fmt: skip
        grads_sliced.wy_bwd(k, v, g, beta, t_inv, d_delta, dk_part, dw, dG_step, dG_tok, geo, seqs,
                            hoisted=hoisted)  # fmt: skip
    wy = [name for name in launched if name.startswith("wy_bwd")]
    assert wy == ["wy_bwd_hoisted_kernel"] + ["wy_bwd_sliced_kernel"] * 3


def test_wyhoist_flag_parses():
    opts = parse_options(HOIST)
    assert opts.wyhoist and opts.kslice
    assert parse_options(opts.text()) == opts
    assert parse_options("default").wyhoist  # in the default since the fourteenth session
    assert not parse_options("kslice").wyhoist


@pytest.mark.parametrize(("n_h", "T", "gated"), [(1, 70, True), (2, 45, False), (3, 50, True)])
def test_wyhoist_matches_reference_fp16(n_h, T, gated):
    inputs = make_inputs(2, T, 2, 32, 16, n_h, dtype=torch.float16, gated=gated)
    check_against_reference(inputs, n_h, None, *FP16_TOL, kernel=variant_kernel(HOIST))


def test_wyhoist_varlen_matches_reference():
    cu = torch.tensor([0, 9, 9, 40, 47], dtype=torch.int32)
    inputs = make_inputs(1, 47, 2, 32, 16, 3, num_seqs=4)
    check_against_reference(inputs, 3, cu, 1e-5, 1e-5, 1e-5, kernel=variant_kernel(HOIST))


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_gpu_hoisted_agrees_with_sliced(n_h, monkeypatch):
    """The same products in another load order, at the default op's own call in bf16 (1,000 tokens in two
    documents, 8 heads, K = V = 64). Where the compiled kernels sum in another order, outputs rounded to bf16
    may flip in their last bit: 1e-3 relative RMS allows that, not a wrong term."""
    cu = torch.tensor([0, 9, 1000], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 1000, 8, 64, 64, n_h, num_seqs=2, device="cuda", dtype=torch.bfloat16)
    inputs["beta"] = inputs["beta"].to(torch.bfloat16)
    assert compare_at_the_default_paths_call(monkeypatch, inputs, n_h, cu, tol=1e-3) == ["torch.bfloat16"]


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2, 3, 4])
def test_gpu_wyhoist_bf16_matches_reference(n_h):
    check_gpu_bf16(HOIST, n_h, 64)


@pytest.mark.gpu
def test_gpu_wyhoist_varlen_and_gate_extremes():
    """Five documents (one of a single token) at n_h = 3, then log gates near 0 and below −30; K = V = 64."""
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 64, 64, 3, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 3, cu, *ISSUE_TOL, kernel=variant_kernel(HOIST))
    for gate_range in [(-1e-6, 0.0), (-60.0, -30.0)]:
        inputs = make_inputs(2, 250, 4, 64, 64, 2, device="cuda", dtype=torch.bfloat16, gate_range=gate_range)
        check_against_reference(inputs, 2, None, *ISSUE_TOL, dg_floor=1e-3, kernel=variant_kernel(HOIST))
