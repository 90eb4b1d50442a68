"""The chunked Triton op against the fp64 recurrent reference.

CPU (TRITON_INTERPRET=1, set by conftest): tiny shapes — odd T, varlen, states, n_h = 1..6, gates near 0 and
1, gradients of every input, the custom-op plumbing; fp32 inputs at 1e-5 (the interpreter's products are
exact) and fp16 inputs through the 16-bit storage path (row-scaled fp16 W and U, 16-bit δ) at the bf16
tolerances, on shapes that take every kernel of the launch table. GPU (``gpu`` marker): real shapes in
bf16 at the same tolerances; fp32 at 1e-4 is in ``test_fp32_precision.py``.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta.ops.gated_delta_product.reference import gated_delta_product_recurrent
from titan_delta.testing import assert_rel_close, poison_, rel_rms_error
from titan_delta_kernels.gated_delta_product import gated_delta_product_triton
from titan_delta_kernels.gated_delta_product.chunk import gdp_chunk_fwd

from .helpers import BF16_TOL, FP16_TOL, NAMES, check_against_reference, make_inputs, random_cu_seqlens


# ---------------------------------------------------------------- CPU (interpreter) tests, tiny shapes
@pytest.mark.parametrize(
    ("n_h", "T", "gated"),
    [(1, 21, True), (2, 19, True), (3, 23, True), (3, 9, False), (4, 18, True), (6, 11, True)],
)
def test_chunked_matches_reference(n_h, T, gated):
    inputs = make_inputs(2, T, 2, 16, 32, n_h, gated=gated)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5)


def test_value_head_wider_than_every_tile():
    """V = 256 (the 340M flavors' value heads) in one op: V loops and V tiles of every stage, fp32 path."""
    inputs = make_inputs(1, 19, 1, 16, 256, 2)
    check_against_reference(inputs, 2, None, 1e-5, 1e-5, 1e-5)


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
    o, final, t_inv, w, _, states, v_new = gdp_chunk_fwd(*args[:5], args[5], None, 3, 0.25)
    for out in (o, final, t_inv, w, states, v_new):
        assert torch.isfinite(out).all()
    expected = o.clone()
    poison_(o)
    o2, *_ = gdp_chunk_fwd(*args[:5], args[5], None, 3, 0.25)
    assert_rel_close(o2, expected, 0.0, "o rerun")


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
    """Fake (meta) outputs must match the real ones in shape and dtype: W fp16 with row scales for bf16."""
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
        ("v", "wide", "K <= 128 and V <= 256"),
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
        inputs["v"] = inputs["v"].repeat(1, 1, 1, 17)
    else:
        inputs["q"] = inputs["q"].double()
    with pytest.raises((ValueError, TypeError), match=message):
        gated_delta_product_triton(*(inputs[n] for n in NAMES[:5]), num_householder=n_h)


# 16-bit inputs (fp16: the interpreter's bf16 products are not faithful). The shapes reach the short-loop and
# general state passes (K a power of two or not, V a multiple of the tile or not), the series and the
# substitution transform (n_h <= 4 / >= 5), the hoisted and the sliced wy_bwd (K, V <= 64 or not), fp16 W·S
# (K = 128), both output kernels, and value heads wider than 128 (one V tile of 256 in the transform and the
# output kernels, V loops of four tiles in the gradient kernels; V = 192 ends in a partial tile).
FP16_CASES = [
    (1, 70, 2, 32, 32, True),
    (2, 45, 2, 64, 64, False),
    (3, 50, 1, 64, 48, True),
    (4, 33, 2, 48, 32, True),
    (5, 21, 1, 32, 32, True),
    (2, 40, 1, 128, 128, True),
    (3, 30, 1, 96, 128, False),
    (2, 37, 1, 32, 256, True),
    (1, 30, 1, 32, 192, True),
    (4, 20, 1, 32, 256, False),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("n_h", "T", "H", "K", "V", "gated"), FP16_CASES)
def test_fp16_matches_reference(n_h, T, H, K, V, gated):
    inputs = make_inputs(1, T, H, K, V, n_h, gated=gated, dtype=torch.float16)
    check_against_reference(inputs, n_h, None, *FP16_TOL)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("n_h", [2, 3])
def test_fp16_varlen_with_empty_document(n_h):
    """Documents: one empty, one shorter than a chunk, one of a single token."""
    cu = torch.tensor([0, 0, 5, 40, 41], dtype=torch.int32)
    inputs = make_inputs(1, 41, 2, 32, 32, n_h, num_seqs=4, dtype=torch.float16)
    check_against_reference(inputs, n_h, cu, *FP16_TOL)


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
GPU_CASES = [
    (1, 4, 200, 4, 128, 128),
    (2, 2, 301, 4, 64, 64),
    (2, 2, 301, 4, 128, 256),
    (1, 1, 200, 2, 128, 256),
    (4, 1, 99, 2, 128, 256),
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
    check_against_reference(inputs, n_h, None, *BF16_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("gate_range", [(-1e-6, 0.0), (-60.0, -30.0)])
def test_gpu_bf16_gates_near_one_and_zero(gate_range):
    inputs = make_inputs(2, 250, 4, 128, 128, 2, device="cuda", dtype=torch.bfloat16, gate_range=gate_range)
    check_against_reference(inputs, 2, None, *BF16_TOL, dg_floor=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_gpu_varlen_equals_split_and_reference(n_h):
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, n_h, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, n_h, cu, *BF16_TOL)
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
@pytest.mark.parametrize(("n_h", "T", "K", "gated", "gate_range", "dg_floor"), [
    (2, 301, 64, False, (-0.5, 0.0), 0.0), (4, 99, 64, False, (-0.5, 0.0), 0.0),
    (2, 250, 128, True, (-1e-6, 0.0), 1e-3), (3, 177, 128, False, (-0.5, 0.0), 0.0),
])  # fmt: skip
def test_gpu_bf16_hard_configs(n_h, T, K, gated, gate_range, dg_floor):
    """No gate at n_h = 2 and 4 and gates near 1: where storing more in 16 bits once failed."""
    inputs = make_inputs(2, T, 4, K, K, n_h, gated=gated, device="cuda", dtype=torch.bfloat16,
                         gate_range=gate_range)  # fmt: skip
    check_against_reference(inputs, n_h, None, *BF16_TOL, dg_floor=dg_floor)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1e-6, 1e4])
def test_gpu_bf16_far_from_unit_scale(scale):
    """Values and states far from 1: the row-scaled fp16 W and U and the power-of-two scaled fp16 products
    keep their range."""
    inputs = make_inputs(2, 200, 4, 128, 128, 2, device="cuda", dtype=torch.bfloat16)
    inputs["v"] = (inputs["v"].float() * scale).to(torch.bfloat16)
    inputs["initial_state"] = inputs["initial_state"] * scale
    check_against_reference(inputs, 2, None, *BF16_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_gpu_bf16_launch_table_kernels_at_the_benchmark_shapes(n_h):
    """K = V = 64 (hoisted wy_bwd, 64-column forward tiles, the dqkw register cap) and K = V = 128 (fp16 W·S,
    sliced wy_bwd) at the benchmark's head dims, on a short sequence."""
    for K in (64, 128):
        inputs = make_inputs(2, 333, 4, K, K, n_h, device="cuda", dtype=torch.bfloat16)
        check_against_reference(inputs, n_h, None, *BF16_TOL)
