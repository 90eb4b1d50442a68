"""The ``wplanes`` variant (ninth session): W stored as two 16-bit planes [hi | lo] (``state.split_planes``).

CPU (interpreter, where the planes are fp16 and products exact fp32): the planes carry W to ~2^-22; the
series transform writes exactly ``split_planes`` of its fp32 W; the forward state pass with planes lands
within split error of fp32 W, the reverse pass on bf16x3's products; end to end against the fp64 oracle
(fp16 inputs, documents), and a no-op for fp32 inputs.
GPU: bf16 at the issue's tolerances, and the reverse pass against bf16x3 on fp32 W.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product import state
from titan_delta_kernels.gated_delta_product.options import parse_options
from titan_delta_kernels.gated_delta_product.state import (
    is_planes,
    plane_dtype,
    split_planes,
    state_bwd,
    state_fwd,
)
from titan_delta_kernels.gated_delta_product.wy_series import wy_fwd_series

from .test_gated_delta_product_fast import (
    check_gpu_bf16,
    check_gpu_varlen_and_gate_extremes,
    chunked_inputs,
    variant_kernel,
)
from .test_gated_delta_product_triton import check_against_reference, make_inputs, run_with_grads


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative RMS difference; 0 for equal tensors (a single chunk's state gradient is all zeros)."""
    if torch.equal(a, b):
        return 0.0
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def transform_inputs(dtype: torch.dtype, n_h: int, T: int = 40, K: int = 32, V: int = 16,
                     device: str = "cpu"):  # fmt: skip
    torch.manual_seed(5 + n_h)
    return chunked_inputs(1, T, n_h, K, V, device=device, dtype=dtype)


def test_wplanes_parse_and_split():
    assert parse_options("default+wplanes").wplanes and not parse_options("default").wplanes
    w = torch.randn(3, 5, 2, 16) * 3
    planes = split_planes(w)
    assert planes.shape == (3, 5, 2, 32) and planes.dtype == plane_dtype()
    assert is_planes(planes, w) and not is_planes(w, w)
    hi, lo = planes.float().split(16, dim=-1)
    assert torch.equal(hi, w.to(plane_dtype()).float())
    assert rel(hi + lo, w) < 2e-6 < rel(hi, w)


@pytest.mark.parametrize("n_h", [1, 3])
def test_series_transform_writes_the_planes_of_its_w(n_h):
    x, geo, seqs = transform_inputs(torch.float16, n_h)
    args = (x["k"], x["v"], x["beta"], x["g"], geo, seqs)
    t_inv, w, u = wy_fwd_series(*args)
    t_p, w_p, u_p = wy_fwd_series(*args, w_planes=True)
    assert torch.equal(t_inv, t_p) and torch.equal(u, u_p)
    assert torch.equal(w_p, split_planes(w))


@pytest.mark.parametrize(("n_h", "gated"), [(1, True), (2, False), (3, True)])
def test_state_passes_with_planes(n_h, gated):
    """Forward: W = hi + lo back in fp32, within split error of fp32 W (exact products here). Reverse:
    bf16x3's own products, from the planes instead of registers, on 64-column V tiles."""
    x, geo, seqs = transform_inputs(torch.float16, n_h)
    if not gated:
        x["g"] = None
    _, w, u = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs)
    planes = split_planes(w)
    base = state_fwd(x["k"], w, u, x["g"], x["initial_state"], geo, seqs)
    got = state_fwd(x["k"], planes, u, x["g"], x["initial_state"], geo, seqs)
    assert not torch.equal(base[1], got[1])  # the planes path ran (δ moves at rounding level)
    for name, a, b in zip(("chunk_states", "delta", "final_state"), got, base, strict=True):
        assert rel(a, b) < (2e-3 if name == "chunk_states" else 1e-5), name  # chunk states are fp16 here

    d_out = torch.randn(1, 40, 2, 16).to(torch.float16)
    from titan_delta_kernels.gated_delta_product.output import dv_local

    dvl = dv_local(x["q"], x["k"], x["g"], d_out, 0.25, geo, seqs)
    common = (x["q"], x["k"])
    tail = (x["g"], d_out, None, dvl, 0.25, geo, seqs)
    split3 = state_bwd(*common, w, *tail, wt_mode=3, block_v=64)
    from_planes = state_bwd(*common, planes, *tail, wt_mode=0)  # planes imply the split products
    assert state._bwd_block_v(n_h, planes=True) == 64 == state._bwd_block_v(1)
    for name, a, b in zip(("d_chunk_states", "d_delta", "d_h0"), from_planes, split3, strict=True):
        assert rel(a, b) < 1e-6, name


def test_wplanes_matches_reference_fp16_varlen():
    torch.manual_seed(11)
    cu = torch.tensor([0, 9, 9, 30], dtype=torch.int32)
    inputs = make_inputs(1, 30, 2, 32, 16, 2, num_seqs=3, dtype=torch.float16)
    check_against_reference(inputs, 2, cu, 5e-3, 1e-2, 2e-2, kernel=variant_kernel("default+wplanes"))
    inputs = make_inputs(2, 21, 2, 16, 16, 3, dtype=torch.float16, gated=False)
    check_against_reference(inputs, 3, None, 5e-3, 1e-2, 2e-2, kernel=variant_kernel("plain+wplanes"))


def test_wplanes_is_a_no_op_for_fp32():
    torch.manual_seed(4)
    inputs = make_inputs(1, 23, 2, 16, 16, 2)
    d_out = torch.randn(1, 23, 2, 16, dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    a = run_with_grads(variant_kernel("default"), inputs, 2, None, d_out, d_final)
    b = run_with_grads(variant_kernel("default+wplanes"), inputs, 2, None, d_out, d_final)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(a[2][n], b[2][n]) for n in a[2])


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K"), [(1, 128), (2, 64), (3, 128)])
def test_gpu_wplanes_bf16_matches_reference(n_h, K):
    check_gpu_bf16("default+wplanes", n_h, K)


@pytest.mark.gpu
def test_gpu_wplanes_varlen_gate_extremes_and_reverse_pass():
    check_gpu_varlen_and_gate_extremes("default+wplanes")
    x, geo, seqs = transform_inputs(torch.bfloat16, 2, T=300, K=128, V=128, device="cuda")
    _, w, _ = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs)
    from titan_delta_kernels.gated_delta_product.output import dv_local

    d_out = torch.randn(1, 300, 2, 128, device="cuda", dtype=torch.bfloat16)
    dvl = dv_local(x["q"], x["k"], x["g"], d_out, 0.1, geo, seqs)
    tail = (x["g"], d_out, None, dvl, 0.1, geo, seqs)
    split3 = state_bwd(x["q"], x["k"], w, *tail, wt_mode=3)
    from_planes = state_bwd(x["q"], x["k"], split_planes(w), *tail)
    for a, b in zip(from_planes, split3, strict=True):
        assert rel(a, b) < 1e-5
