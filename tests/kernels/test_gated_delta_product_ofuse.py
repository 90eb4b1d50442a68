"""``ofuse``: the forward state pass writes the outputs (``output.fused_chunk_output``), no output kernel.

CPU (interpreter): o equal to the separate output kernel's on the same inputs up to the order of fp32 sums
(fp32 and fp16, with and without ``w16`` and ``lowp_safe``, documents of odd lengths, one empty); end to end
against the fp64 oracle (n_h = 1..4, gated or not, gates near 0 and 1, several V tiles); every output element
written (poisoned buffer).
GPU: bf16 at the issue's tolerances; o within rounding of the separate kernel's.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta.testing import poison_
from titan_delta_kernels.gated_delta_product.output import output_fwd
from titan_delta_kernels.gated_delta_product.state import state_fwd
from titan_delta_kernels.gated_delta_product.wy_series import wy_fwd_series

from .test_gated_delta_product_fast import (
    check_gpu_bf16,
    check_gpu_varlen_and_gate_extremes,
    chunked_inputs,
    variant_kernel,
)
from .test_gated_delta_product_triton import check_against_reference, make_inputs, run_with_grads

FUSED = "default+ofuse"
FP16_TOL = (5e-3, 1e-2, 2e-2)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def fused_and_separate(x, geo, seqs, row_scaled: bool, delta_dtype, block_v: int | None = None):
    """o from the fused pass (into a poisoned buffer) and from output_fwd on the states and δ it returned."""
    _, w, u, *scales = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs, row_scaled=row_scaled)
    kw = dict(w_scale=scales[0], u_scale=scales[1]) if row_scaled else {}
    q = x["q"]
    o = q.new_empty(*q.shape[:3], x["v"].shape[-1])
    poison_(o)
    states, delta, _ = state_fwd(x["k"], w, u, x["g"], x["initial_state"], geo, seqs, delta_dtype=delta_dtype,
                                 output=(q, o, 0.3), block_v=block_v, **kw)  # fmt: skip
    ref = output_fwd(q, x["k"], x["g"], delta, states, 0.3, geo, seqs)
    return o, ref


@pytest.mark.parametrize(("n_h", "gated"), [(1, True), (2, False), (3, True), (4, True)])
@pytest.mark.parametrize("cu", [None, [0, 13, 13, 50, 77]])
def test_fused_output_is_the_output_kernels_fp32(n_h, gated, cu):
    x, geo, seqs = chunked_inputs(1, 77, n_h, 32, 48, cu=cu, num_seqs=None if cu is None else 4, gated=gated)
    o, ref = fused_and_separate(x, geo, seqs, False, None, block_v=16)  # three V tiles
    assert torch.isfinite(o).all() and rel(o, ref) < 1e-6  # only the sums' order differs (tile shapes)


@pytest.mark.parametrize(("row_scaled", "delta_dtype"), [(False, None), (True, torch.float32),
                                                         (True, torch.float16), (False, torch.float16)])
def test_fused_output_is_the_output_kernels_fp16(row_scaled, delta_dtype):
    """fp16 inputs with the storage of w16 (row-scaled W and U) and lowp_safe (16-bit δ)."""
    x, geo, seqs = chunked_inputs(1, 70, 2, 32, 32, cu=[0, 31, 70], num_seqs=2, dtype=torch.float16)
    o, ref = fused_and_separate(x, geo, seqs, row_scaled, delta_dtype)
    assert o.dtype == torch.float16 and torch.isfinite(o).all()
    assert rel(o, ref) < 2.0**-12  # fp16 roundings of fp32 values that differ in the last bits


@pytest.mark.parametrize(("n_h", "T", "gated"), [(1, 70, True), (2, 45, False), (3, 50, True), (4, 33, True)])
def test_ofuse_matches_reference_fp32(n_h, T, gated):
    inputs = make_inputs(2, T, 2, 32, 16, n_h, gated=gated)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5, kernel=variant_kernel(FUSED))


@pytest.mark.parametrize("gate_range", [(-1e-6, 0.0), (-60.0, -30.0)])
def test_ofuse_gate_extremes_fp32(gate_range):
    inputs = make_inputs(1, 40, 2, 16, 16, 2, gate_range=gate_range)
    check_against_reference(inputs, 2, None, 1e-5, 1e-5, 1e-5, dg_floor=1e-3, kernel=variant_kernel(FUSED))


@pytest.mark.parametrize("variant", ["default+ofuse+w16+lowp_safe", "plain+wyseries+ofuse+w16"])
def test_ofuse_varlen_fp16(variant):
    cu = torch.tensor([0, 9, 9, 40, 47], dtype=torch.int32)
    inputs = make_inputs(1, 47, 2, 32, 16, 3, num_seqs=4, dtype=torch.float16)
    check_against_reference(inputs, 3, cu, *FP16_TOL, kernel=variant_kernel(variant))


def test_ofuse_skips_the_output_kernel(monkeypatch):
    """With ofuse the custom op never launches output_fwd (and without it, it does)."""
    from titan_delta_kernels.gated_delta_product import chunk

    calls: list[int] = []
    real = chunk.output_fwd

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(chunk, "output_fwd", counting)
    inputs = make_inputs(1, 20, 2, 16, 16, 2)
    d_out = torch.randn(1, 20, 2, 16, dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    run_with_grads(variant_kernel(FUSED), inputs, 2, None, d_out, d_final)
    assert calls == []
    run_with_grads(variant_kernel("default"), inputs, 2, None, d_out, d_final)
    assert calls == [1]


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize("variant", [FUSED, "default+ofuse+w16+lowp_safe"])
@pytest.mark.parametrize(("n_h", "K"), [(1, 128), (2, 64), (3, 128)])
def test_gpu_ofuse_bf16_matches_reference(variant, n_h, K):
    check_gpu_bf16(variant, n_h, K)


@pytest.mark.gpu
def test_gpu_ofuse_varlen_and_gate_extremes():
    check_gpu_varlen_and_gate_extremes("default+ofuse+w16+lowp_safe")


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K", "row_scaled", "delta_dtype"),
                         [(2, 128, False, None), (3, 64, True, torch.float32),
                          (2, 128, True, torch.bfloat16)])  # fmt: skip
def test_gpu_fused_output_against_output_kernel(n_h, K, row_scaled, delta_dtype):
    """Same products in the same dtypes as output_fwd: o within the bf16 rounding of the output itself
    (the two compiled kernels may order their fp32 accumulations differently)."""
    x, geo, seqs = chunked_inputs(2, 513, n_h, K, K, device="cuda", dtype=torch.bfloat16)
    o, ref = fused_and_separate(x, geo, seqs, row_scaled, delta_dtype)
    assert torch.isfinite(o).all() and rel(o, ref) < 2e-3
