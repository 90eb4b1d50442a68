"""Triton Gated DeltaProduct kernels against the fp64 recurrent reference.

CPU (TRITON_INTERPRET=1, set by conftest): tiny shapes — odd T, varlen, states, n_h = 1..4, gates near
0 and 1, gradients of every input, the decode kernel, the custom-op plumbing. GPU (``gpu`` marker): real
shapes in bf16 with the issue's tolerances, chunked == recurrent == varlen-split.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from titan_delta.ops.gated_delta_product.reference import (
    gated_delta_product_chunked,
    gated_delta_product_recurrent,
)
from titan_delta.testing import assert_rel_close, poison_, rel_rms_error
from titan_delta_kernels.gated_delta_product import (
    gated_delta_product_recurrent_triton,
    gated_delta_product_triton,
)
from titan_delta_kernels.gated_delta_product.chunk import gdp_chunk_fwd

NAMES = ("q", "k", "v", "g", "beta", "initial_state")


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
    a fraction of ‖dβ‖, for gates so close to 0 that the true dg (~e^{-30}) is below bf16 noise.
    ``kernel``: the entry point under test (the variants' tests pass one with options bound)."""
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


# ---------------------------------------------------------------- CPU (interpreter) tests, tiny shapes
@pytest.mark.parametrize(
    ("n_h", "T", "gated"),
    [(1, 21, True), (2, 19, True), (3, 23, True), (3, 9, False), (4, 18, True), (6, 11, True)],
)
def test_chunked_matches_reference(n_h, T, gated):
    inputs = make_inputs(2, T, 2, 16, 32, n_h, gated=gated)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5)


@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_varlen_matches_reference(n_h):
    cu = random_cu_seqlens(24, 4)
    inputs = make_inputs(1, 24, 2, 16, 16, n_h, num_seqs=4)
    check_against_reference(inputs, n_h, cu, 1e-5, 1e-5, 1e-5)


@pytest.mark.parametrize(("n_h", "T", "cu"), [(1, 141, None), (2, 75, [0, 70, 71, 75])])
def test_several_chunks_per_sequence(n_h, T, cu):
    """Chunks hold 64 // n_h tokens: these lengths cross 2–3 chunk boundaries inside one document."""
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    inputs = make_inputs(1, T, 1, 16, 16, n_h, num_seqs=None if cu is None else cu.numel() - 1)
    check_against_reference(inputs, n_h, cu, 1e-5, 1e-5, 1e-5)


@pytest.mark.parametrize("gate_range", [(-1e-6, 0.0), (-60.0, -30.0), (-1e4, -1e3)])
def test_gates_near_one_and_zero_stay_finite_and_accurate(gate_range):
    """Within-chunk cumulative log gates reach |G| ~ 1e5 here: same-token differences must stay exact zeros
    and same-token gate-gradient pairs must not be left to cancel in fp32 (the true dg is ~1e-13)."""
    inputs = make_inputs(1, 22, 1, 16, 16, 2, gate_range=gate_range)
    check_against_reference(inputs, 2, None, 1e-5, 1e-5, 1e-4)


def test_without_initial_state_and_unused_final_state():
    inputs = make_inputs(2, 17, 2, 32, 16, 2)
    inputs["initial_state"] = None
    args = [inputs[n] for n in NAMES[:5]]
    o, final = gated_delta_product_triton(*args, num_householder=2)
    ro, _ = gated_delta_product_recurrent(*(x.double() for x in args), num_householder=2)
    assert final is None
    assert_rel_close(o, ro, 1e-5, "o")


@pytest.mark.parametrize("loss_on", ["output", "final_state"])
def test_gradients_when_only_one_result_is_used(loss_on):
    """Training uses o only (no gradient reaches the final state) — and the reverse must work too."""
    inputs = make_inputs(1, 14, 2, 16, 16, 2, num_seqs=1)
    grads = {}
    for name, fn, dtype in (("ours", gated_delta_product_triton, torch.float32),
                            ("ref", gated_delta_product_recurrent, torch.float64)):  # fmt: skip
        leaves = {n: x.detach().to(dtype).requires_grad_() for n, x in inputs.items()}
        o, final = fn(*(leaves[n] for n in NAMES[:5]), num_householder=2,
                      initial_state=leaves["initial_state"], output_final_state=True)  # fmt: skip
        loss = o.square().sum() if loss_on == "output" else final.square().sum()
        found = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        pairs = zip(leaves.values(), found, strict=True)
        grads[name] = [torch.zeros_like(x) if d is None else d for x, d in pairs]
    for n, a, b in zip(NAMES, grads["ours"], grads["ref"], strict=True):
        if n == "q" and loss_on == "final_state":
            assert a.abs().max() == 0  # the final state does not depend on the queries
            continue
        assert_rel_close(a, b, 1e-5, f"d{n}")


def test_public_op_dispatches_to_the_kernel():
    """``titan_delta.ops.gated_delta_product(..., backend="triton")`` runs this kernel (interpreted here)."""
    from titan_delta.ops import gated_delta_product

    inputs = make_inputs(1, 10, 1, 16, 16, 3)
    args = [inputs[n] for n in NAMES[:5]]
    o, final = gated_delta_product(*args, num_householder=3, initial_state=inputs["initial_state"],
                                   output_final_state=True, backend="triton")  # fmt: skip
    o_k, final_k = gated_delta_product_triton(*args, num_householder=3, initial_state=inputs["initial_state"],
                                              output_final_state=True)  # fmt: skip
    assert_rel_close(o, o_k, 0.0, "o")
    assert_rel_close(final, final_k, 0.0, "final_state")


def test_outputs_are_fully_written():
    """Poisoned buffers (NaN) must be overwritten: run the raw op twice on poisoned memory-sized inputs."""
    inputs = make_inputs(1, 13, 1, 16, 16, 3)
    args = [inputs[n] for n in NAMES]
    o, final, _, w, u, _, v_new, *_ = gdp_chunk_fwd(*args[:5], args[5], None, 3, 0.25)
    for out in (o, final, w, u, v_new):
        assert torch.isfinite(out).all()
    expected = o.clone()
    poison_(o)
    o2, *_ = gdp_chunk_fwd(*args[:5], args[5], None, 3, 0.25)
    assert_rel_close(o2, expected, 0.0, "o rerun")


@pytest.mark.parametrize(("n_h", "varlen"), [(2, False), (3, True)])
def test_recurrent_decode_matches_reference(n_h, varlen):
    B, T, N = (1, 7, 3) if varlen else (2, 3, 2)
    inputs = make_inputs(B, T, 2, 16, 32, n_h, num_seqs=N)
    cu = torch.tensor([0, 2, 2, 7], dtype=torch.int32) if varlen else None
    args = [inputs[n] for n in NAMES[:5]]
    o, final = gated_delta_product_recurrent_triton(
        *args, num_householder=n_h, initial_state=inputs["initial_state"], output_final_state=True,
        cu_seqlens=cu,
    )  # fmt: skip
    ro, rfinal = gated_delta_product_recurrent(
        *(None if x is None else x.double() for x in args), num_householder=n_h,
        initial_state=inputs["initial_state"].double(), output_final_state=True, cu_seqlens=cu,
    )  # fmt: skip
    assert_rel_close(o, ro, 1e-5, "o")
    assert_rel_close(final, rfinal, 1e-5, "final_state")


def test_decode_continues_a_chunked_prefill():
    """Prefill with the chunked kernel, decode 2 tokens with the recurrent one == one pass over all."""
    n_h, T = 2, 18
    inputs = make_inputs(1, T + 2, 1, 16, 16, n_h)
    q, k, v, g, beta, h0 = (inputs[n] for n in NAMES)
    _, state = gated_delta_product_triton(
        q[:, :T], k[:, : T * n_h], v[:, : T * n_h], g[:, :T], beta[:, : T * n_h], num_householder=n_h,
        initial_state=h0, output_final_state=True,
    )  # fmt: skip
    o_dec, final = gated_delta_product_recurrent_triton(
        q[:, T:], k[:, T * n_h :], v[:, T * n_h :], g[:, T:], beta[:, T * n_h :], num_householder=n_h,
        initial_state=state, output_final_state=True,
    )  # fmt: skip
    ro, rfinal = gated_delta_product_recurrent(
        *(x.double() for x in (q, k, v, g, beta)), num_householder=n_h, initial_state=h0.double(),
        output_final_state=True,
    )  # fmt: skip
    assert_rel_close(o_dec, ro[:, T:], 1e-5, "decoded o")
    assert_rel_close(final, rfinal, 1e-5, "final_state")


def test_compiles_fullgraph_with_backward():
    inputs = make_inputs(1, 9, 1, 16, 16, 2)
    leaves = {n: x.detach().requires_grad_() for n, x in inputs.items()}

    def block(q, k, v, g, beta, h0):
        o, final = gated_delta_product_triton(
            q, k, v, g, beta, num_householder=2, initial_state=h0, output_final_state=True
        )
        return o.square().sum() + final.sum()

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    loss = compiled(*leaves.values())
    grads = torch.autograd.grad(loss, list(leaves.values()))
    eager_leaves = {n: x.detach().requires_grad_() for n, x in inputs.items()}
    expected = torch.autograd.grad(block(*eager_leaves.values()), list(eager_leaves.values()))
    for name, a, b in zip(NAMES, grads, expected, strict=True):
        assert_rel_close(a, b, 1e-6, f"compiled d{name}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the CPU interpreter's bf16 arithmetic is not faithful
def test_fake_implementation_matches_real_shapes():
    """Fake (meta) outputs must match the real ones in shape and dtype: W and U are fp32 even for bf16."""
    inputs = make_inputs(1, 10, 2, 16, 32, 3, num_seqs=2)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    inputs = {n: x.to(torch.bfloat16) if n in ("q", "k", "v") else x for n, x in inputs.items()}
    args = (*(inputs[n] for n in NAMES), cu, 3, 0.5)
    torch.library.opcheck(gdp_chunk_fwd, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        ("num_householder", 9, "num_householder must be in 1..8"),
        ("k", "short", "T\\*num_householder"),
        ("q", "fp64", "q must have dtype"),
        ("v", "wide", "K, V <= 128"),
    ],
)
def test_bad_input_names_the_field(field, bad, message):
    inputs = make_inputs(1, 4, 1, 16, 16, 2)
    n_h = 2
    if field == "num_householder":
        n_h = bad
    elif bad == "short":
        inputs["k"] = inputs["k"][:, :-1]
    elif bad == "wide":
        inputs["v"] = inputs["v"].repeat(1, 1, 1, 16)
    else:
        inputs["q"] = inputs["q"].double()
    with pytest.raises((ValueError, TypeError), match=message):
        gated_delta_product_triton(*(inputs[n] for n in NAMES[:5]), num_householder=n_h)


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
GPU_CASES = [
    (1, 4, 200, 4, 128, 128),
    (2, 2, 301, 4, 64, 64),
    (3, 2, 177, 4, 128, 128),
    (4, 2, 99, 4, 64, 64),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "B", "T", "H", "K", "V"), GPU_CASES)
@pytest.mark.parametrize("gated", [True, False])
def test_gpu_bf16_matches_reference(n_h, B, T, H, K, V, gated):
    inputs = make_inputs(B, T, H, K, V, n_h, gated=gated, device="cuda", dtype=torch.bfloat16,
                         gate_range=(-0.5, 0.0))  # fmt: skip
    inputs["beta"] = inputs["beta"].to(torch.bfloat16)
    check_against_reference(inputs, n_h, None, 5e-3, 1e-2, 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("gate_range", [(-1e-6, 0.0), (-60.0, -30.0)])
def test_gpu_bf16_gates_near_one_and_zero(gate_range):
    inputs = make_inputs(2, 250, 4, 128, 128, 2, device="cuda", dtype=torch.bfloat16, gate_range=gate_range)
    check_against_reference(inputs, 2, None, 5e-3, 1e-2, 2e-2, dg_floor=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_gpu_varlen_equals_split_and_reference(n_h):
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, n_h, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, n_h, cu, 5e-3, 1e-2, 2e-2)
    q, k, v, g, beta, h0 = (inputs[n] for n in NAMES)
    o, final = gated_delta_product_triton(q, k, v, g, beta, num_householder=n_h, initial_state=h0,
                                          output_final_state=True, cu_seqlens=cu)  # fmt: skip
    bounds = cu.tolist()
    for i in range(5):
        a, b = bounds[i], bounds[i + 1]
        steps = slice(a * n_h, b * n_h)
        o_i, f_i = gated_delta_product_triton(
            q[:, a:b], k[:, steps], v[:, steps], g[:, a:b], beta[:, steps],
            num_householder=n_h, initial_state=h0[i : i + 1], output_final_state=True,
        )  # fmt: skip
        if b > a:
            assert rel_rms_error(o[:, a:b], o_i) <= 1e-6
        assert rel_rms_error(final[i : i + 1], f_i) <= 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [2, 3])
def test_gpu_chunked_equals_recurrent_kernel_and_chunked_reference(n_h):
    inputs = make_inputs(2, 513, 4, 128, 128, n_h, device="cuda", dtype=torch.bfloat16)
    args = [inputs[n] for n in NAMES[:5]]
    kw = dict(num_householder=n_h, initial_state=inputs["initial_state"], output_final_state=True)
    o, final = gated_delta_product_triton(*args, **kw)
    o_rec, final_rec = gated_delta_product_recurrent_triton(*args, **kw)
    o_ref, final_ref = gated_delta_product_chunked(*(None if x is None else x.double() for x in args), **kw)
    assert_rel_close(o, o_ref, 5e-3, "chunked o")
    assert_rel_close(o_rec, o_ref, 5e-3, "recurrent o")
    assert_rel_close(final, final_ref, 5e-3, "chunked final_state")
    assert_rel_close(final_rec, final_ref, 5e-3, "recurrent final_state")
