"""fp32 inputs get fp32-grade products: every kernel of the fp32 path multiplies with
``input_precision="tf32x3"`` (three tf32 products), 16-bit inputs keep ``"tf32"``.

The CPU interpreter computes every product exactly whatever the precision, so on the CPU the launch arguments
are checked, and the fp32 rows of the launch table (narrow tiles and slices, chosen for compile time) against
the fp64 reference at shapes that run their loops several times and end in partial tiles; the 1e-4 bound on
o, the final state and every gradient is checked on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product.launch_table import launch_table

from .helpers import FP32_GPU_TOL, FP32_TOL, check_against_reference, launches, make_inputs


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


# (n_h, T, K, V, cu_seqlens): odd lengths (partial last chunks), K and V that are not multiples of the tiles,
# K = 48 (the general forward state pass), K = 128 (16-column reverse pass), varlen with a one-token document.
FP32_TABLE_CASES = [
    (1, 37, 64, 48, None),
    (2, 37, 48, 80, [0, 5, 6, 37]),
    (3, 37, 64, 64, [0, 30, 37]),
    (4, 37, 32, 40, None),
    (2, 23, 128, 72, None),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("n_h", "T", "K", "V", "cu"), FP32_TABLE_CASES)
def test_fp32_launch_table_matches_reference(n_h, T, K, V, cu):
    """The launches the fp32 rows give on a GPU (the interpreter takes the same table), with a gate and an
    initial state, against the fp64 oracle: every loop of the narrow tiles is summed and masked right."""
    cfg = launch_table(K, V, n_h, torch.float32, True)
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    inputs = make_inputs(1, T, 2, K, V, n_h, num_seqs=None if cu is None else cu.numel() - 1)
    with launches() as log:
        check_against_reference(inputs, n_h, cu, *FP32_TOL)
    ran = {name: kwargs for name, kwargs in log}
    state_fwd = "state_fwd_lean_kernel" if cfg.state_fwd_lean else "state_fwd_kernel"
    output = "output_fwd_t_kernel" if cfg.output_transposed else "output_fwd_kernel"
    assert set(ran) == {"wy_fwd_kernel", state_fwd, output, "dv_local_kernel", "state_bwd_kernel",
                        "dqkw_sliced_kernel", "wy_bwd_sliced_kernel"}  # fmt: skip
    dqkw, wy_bwd, state_bwd = ran["dqkw_sliced_kernel"], ran["wy_bwd_sliced_kernel"], ran["state_bwd_kernel"]
    assert dqkw["BKS"] == dqkw["BV"] == wy_bwd["BKS"] == wy_bwd["BV"] == 16
    assert state_bwd["BV"] == (16 if K > 64 else 32) and state_bwd["num_warps"] == 4
    assert ran["wy_fwd_kernel"]["num_warps"] == (8 if n_h <= 3 else 4)
    assert dqkw["num_warps"] == wy_bwd["num_warps"] == 4


FP32_CASES = [
    (1, 2, 200, 4, 128, 128, True),
    (2, 2, 301, 4, 64, 64, False),
    (3, 2, 177, 4, 128, 128, True),
    (4, 2, 99, 4, 64, 64, True),
    (4, 1, 130, 4, 128, 128, True),
    (2, 2, 150, 4, 96, 48, True),  # V > 64 needs K = 128 on a GPU (tests/ops: the refusal)
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
