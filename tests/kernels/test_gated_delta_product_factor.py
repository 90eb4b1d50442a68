"""The ``wfactor`` variant (ninth session): the forward state pass computes W S as A (K S) from W's factors,
A = T diag(βe^G) in k's dtype, stored by the series transform (``wy_series.wy_fwd_series(w_factor=...)``).

CPU (interpreter, products exact in fp32): W = A K; the state pass from the factors matches the one from W;
end to end against the fp64 oracle (odd T, documents incl. an empty one, no gate, fp16); the flag is ignored
where the series transform does not run (128-step blocks). GPU: bf16 at the issue's tolerances.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout
from titan_delta_kernels.gated_delta_product.options import parse_options
from titan_delta_kernels.gated_delta_product.state import state_fwd
from titan_delta_kernels.gated_delta_product.wy_series import wy_fwd_series

from .test_gated_delta_product_fast import ISSUE_TOL, variant_kernel
from .test_gated_delta_product_triton import check_against_reference, make_inputs


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize(("n_h", "gated"), [(1, True), (2, False), (3, True)])
def test_factor_is_w_left_factor_and_state_pass_matches(n_h, gated):
    torch.manual_seed(20 + n_h)
    T, K, V = 45, 32, 16
    x = make_inputs(1, T, 2, K, V, n_h, gated=gated)
    geo = chunk_geometry(n_h)
    seqs = sequence_layout(1, T, None, geo, torch.device("cpu"))
    factor = torch.full((1, T * n_h, 2, geo.block_steps), float("nan"))  # poisoned: each valid row is written
    _, w, u = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs, w_factor=factor)
    assert torch.isfinite(factor).all()
    # W = A K chunk by chunk (A's columns index the chunk's steps)
    C = geo.tokens_per_chunk * n_h
    for c0 in range(0, T * n_h, C):
        rows = slice(c0, min(c0 + C, T * n_h))
        n = rows.stop - rows.start
        for h in range(2):
            a = factor[0, rows, h, :n].double()
            assert rel(a @ x["k"][0, rows, h].double(), w[0, rows, h]) < 1e-6
    base = state_fwd(x["k"], w, u, x["g"], x["initial_state"], geo, seqs)
    got = state_fwd(x["k"], w, u, x["g"], x["initial_state"], geo, seqs, w_factor=factor)
    for name, a, b in zip(("chunk_states", "delta", "final_state"), got, base, strict=True):
        assert rel(a, b) < 1e-5, name
    assert not torch.equal(got[1], base[1])  # the factored path ran (δ moves at fp32 rounding)


@pytest.mark.parametrize(("variant", "n_h", "T", "gated"), [
    ("default+wfactor", 2, 37, True), ("default+wfactor", 3, 23, False),
    ("default+wfactor+wplanes", 1, 70, True),
])  # fmt: skip
def test_wfactor_matches_reference(variant, n_h, T, gated):
    torch.manual_seed(n_h * T)
    inputs = make_inputs(2, T, 2, 16, 32, n_h, gated=gated)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5, kernel=variant_kernel(variant))


def test_wfactor_varlen_fp16_and_ignored_for_128_step_blocks():
    torch.manual_seed(12)
    cu = torch.tensor([0, 9, 9, 30], dtype=torch.int32)
    inputs = make_inputs(1, 30, 2, 32, 16, 2, num_seqs=3, dtype=torch.float16)
    check_against_reference(inputs, 2, cu, 5e-3, 1e-2, 2e-2, kernel=variant_kernel("default+wfactor"))
    assert parse_options("default+wfactor").wfactor
    inputs = make_inputs(1, 20, 2, 16, 16, 5)  # n_h = 5: 128-step blocks, wy_fwd, no factor
    check_against_reference(inputs, 5, None, 1e-5, 1e-5, 1e-5, kernel=variant_kernel("default+wfactor"))


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K"), [(1, 128), (2, 64), (2, 128), (3, 128), (4, 64)])
def test_gpu_wfactor_bf16_matches_reference(n_h, K):
    inputs = make_inputs(2, 257, 4, K, K, n_h, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0.0))
    inputs["beta"] = inputs["beta"].to(torch.bfloat16)
    check_against_reference(inputs, n_h, None, *ISSUE_TOL, kernel=variant_kernel("default+wfactor"))


@pytest.mark.gpu
def test_gpu_wfactor_varlen_and_gate_extremes():
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, 3, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 3, cu, *ISSUE_TOL, kernel=variant_kernel("default+wfactor"))
    for gate_range in [(-1e-6, 0.0), (-60.0, -30.0)]:
        inputs = make_inputs(2, 250, 4, 128, 128, 2, device="cuda", dtype=torch.bfloat16,
                             gate_range=gate_range)  # fmt: skip
        check_against_reference(inputs, 2, None, *ISSUE_TOL, dg_floor=1e-3,
                                kernel=variant_kernel("default+wfactor"))  # fmt: skip
    inputs = make_inputs(2, 250, 4, 64, 64, 2, gated=False, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 2, None, *ISSUE_TOL, kernel=variant_kernel("default+wfactor"))
