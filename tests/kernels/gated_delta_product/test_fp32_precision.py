"""fp32 inputs get fp32-grade products: every kernel of the fp32 path multiplies with
``input_precision="tf32x3"`` (three tf32 products), 16-bit inputs keep ``"tf32"``.

The CPU interpreter computes every product exactly whatever the precision, so on the CPU only the launch
arguments are checked; the 1e-4 bound on o, the final state and every gradient is checked on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from .helpers import FP32_GPU_TOL, check_against_reference, launches, make_inputs


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("dtype", "precision"), [(torch.float32, "tf32x3"), (torch.float16, "tf32")])
@pytest.mark.parametrize(("n_h", "K", "V"), [(2, 32, 32), (5, 48, 32)])
def test_every_launch_takes_the_dtypes_precision(dtype, precision, n_h, K, V):
    """Forward and backward: each kernel that takes ``PREC`` gets the dtype's precision; the kernels without
    it multiply 16-bit operands only (16-bit inputs) or run no product (the recurrent kernel)."""
    from titan_delta_kernels.gated_delta_product import gated_delta_product_triton

    inputs = make_inputs(1, 20, 1, K, V, n_h, dtype=dtype)
    leaves = [inputs[n].requires_grad_() for n in ("q", "k", "v", "g", "beta")]
    with launches() as log:
        o, _ = gated_delta_product_triton(*leaves, num_householder=n_h)
        o.float().sum().backward()
    names = [name for name, _ in log]
    assert "dqkw_sliced_kernel" in names and len(names) == 7
    for name, kwargs in log:
        if name == "state_bwd_lean_kernel":
            assert dtype != torch.float32  # 16-bit products only, not on the fp32 path
            continue
        assert kwargs["PREC"] == precision, name


FP32_CASES = [
    (1, 2, 200, 4, 128, 128, True),
    (2, 2, 301, 4, 64, 64, False),
    (3, 2, 177, 4, 128, 128, True),
    (4, 2, 99, 4, 64, 64, True),
    (4, 1, 130, 4, 128, 128, True),
    (2, 2, 150, 4, 96, 80, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "B", "T", "H", "K", "V", "gated"), FP32_CASES)
def test_gpu_fp32_matches_reference_at_1e4(n_h, B, T, H, K, V, gated):
    inputs = make_inputs(B, T, H, K, V, n_h, gated=gated, device="cuda", gate_range=(-0.5, 0.0))
    check_against_reference(inputs, n_h, None, *FP32_GPU_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_gpu_fp32_varlen_at_1e4(n_h):
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, n_h, num_seqs=5, device="cuda")
    check_against_reference(inputs, n_h, cu, *FP32_GPU_TOL)


@pytest.mark.gpu
def test_gpu_fp32_refuses_more_than_four_householder_steps():
    inputs = make_inputs(1, 40, 2, 64, 64, 5, gated=True, device="cuda")
    with pytest.raises(ValueError, match="num_householder=5 with float32 inputs"):
        check_against_reference(inputs, 5, None, *FP32_GPU_TOL)
