"""Launch keys of the per-chunk output kernels (ninth session): output_fwd's K slice and V tile (``obk``,
``obv``; it loops over K slices, one by default) and dv_local's V tile (``dbv``); the transposed output
kernel (``otrans``, twelfth session).

CPU (interpreter): end to end against the fp64 oracle in fp32, odd T, documents (one empty), fp16; ``otrans``
against the direct kernel on the same δ and states, with and without the gate. GPU: bf16 at the issue's
tolerances; ``otrans`` against the direct kernel on bf16 δ and states (where its no-gate form once failed).
"""

from __future__ import annotations

import pytest
import torch

from titan_delta_kernels.gated_delta_product.options import parse_options
from titan_delta_kernels.gated_delta_product.output import output_fwd
from titan_delta_kernels.gated_delta_product.state import state_fwd
from titan_delta_kernels.gated_delta_product.wy_series import wy_fwd_series

from .test_gated_delta_product_fast import ISSUE_TOL, check_gpu_bf16, chunked_inputs, variant_kernel
from .test_gated_delta_product_triton import check_against_reference, make_inputs
from .test_gated_delta_product_variants import poisoned_allocations


def test_output_keys_parse():
    assert parse_options("default+obk=64+obv=128").launch_text().endswith("+obk=64+obv=128")
    assert parse_options("default+obk=64").output_block_k == 64
    with pytest.raises(ValueError, match="obk"):
        parse_options("default+obk=48")


def test_output_tile_defaults(monkeypatch):
    """One 128-column V tile in both output kernels, all of K in one slice; the series transform takes 4
    warps; the cost model mirrors the V tile."""
    from titan_delta_kernels.gated_delta_product import cost, output, wy_series

    assert cost.OUTPUT_BLOCK_V == output.OUTPUT_BLOCK_V == 128
    assert wy_series.SERIES_WY_WARPS == 4
    seen = []
    real = output.launch

    def spy(kernel, grid, *args, **kwargs):
        seen.append((kernel.fn.__name__, grid[2], kwargs["BK"], kwargs["BV"]))
        return real(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(output, "launch", spy)
    inputs = make_inputs(1, 20, 2, 64, 128, 2)
    args = [inputs[n].requires_grad_() for n in ("q", "k", "v", "g", "beta")]
    variant_kernel("default")(*args, num_householder=2)[0].sum().backward()
    assert seen == [("output_fwd_t_kernel", 1, 64, 128), ("dv_local_kernel", 1, 64, 128)]  # otrans at n_h = 2
    # without a gate from n_h = 3 (TRANSPOSED_NO_GATE_MIN_NH); at n_h = 1 never
    for n_h, gated, kernel in [(2, False, "output_fwd_kernel"), (3, False, "output_fwd_t_kernel"),
                               (1, True, "output_fwd_kernel")]:  # fmt: skip
        seen.clear()
        x = make_inputs(1, 20, 2, 64, 128, n_h, gated=gated)
        variant_kernel("default")(*[x[n] for n in ("q", "k", "v", "g", "beta")], num_householder=n_h)
        assert seen == [(kernel, 1, 64, 128)], (n_h, gated)


@pytest.mark.parametrize(("variant", "n_h", "T", "K"), [
    ("default+obk=32", 2, 37, 64), ("default+obk=64+obv=32", 3, 23, 128),
    ("default+obv=128+obk=16+dbv=128", 1, 21, 32), ("default+dbv=32", 2, 19, 16),
])  # fmt: skip
def test_output_tiles_match_reference(variant, n_h, T, K):
    torch.manual_seed(n_h * T)
    inputs = make_inputs(2, T, 2, K, 32, n_h)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5, kernel=variant_kernel(variant))


def test_output_tiles_varlen_fp16():
    """Documents (one empty) with fp16 inputs, K in two slices."""
    torch.manual_seed(7)
    cu = torch.tensor([0, 9, 9, 30], dtype=torch.int32)
    inputs = make_inputs(1, 30, 2, 32, 16, 2, num_seqs=3, dtype=torch.float16)
    check_against_reference(inputs, 2, cu, 5e-3, 1e-2, 2e-2, kernel=variant_kernel("default+obk=16"))


def transposed_against_direct(monkeypatch: pytest.MonkeyPatch, n_h: int, T: int, K: int, V: int,
                              dtype: torch.dtype, gated: bool, device: str = "cpu",
                              ) -> list[float]:  # fmt: skip
    """The same δ and chunk states (both in ``dtype``, as the default stores them) through both output
    kernels (their outputs allocated NaN-filled), on the full V tile and on 16-column tiles: o's relative RMS
    difference for each. The transposed kernel runs wherever its routing would pick the direct one (n_h = 1,
    n_h = 2 without a gate: ``TRANSPOSED_MAX_TOKENS`` and ``TRANSPOSED_NO_GATE_MIN_NH`` are lifted)."""
    from titan_delta_kernels.gated_delta_product import output

    monkeypatch.setattr(output, "TRANSPOSED_MAX_TOKENS", 64)
    monkeypatch.setattr(output, "TRANSPOSED_NO_GATE_MIN_NH", 1)
    launched = []
    real = output.launch
    monkeypatch.setattr(output, "launch", lambda kernel, *a, **kw: launched.append(kernel.fn.__name__)
                        or real(kernel, *a, **kw))  # fmt: skip
    x, geo, seqs = chunked_inputs(2, T, n_h, K, V, dtype=dtype, gated=gated, device=device)
    _, w, u = wy_fwd_series(x["k"], x["v"], x["beta"], x["g"], geo, seqs)
    states, delta, _ = state_fwd(x["k"], w, u, x["g"], x["initial_state"], geo, seqs)
    errors = []
    for block_v in (None, 16):
        args = (x["q"], x["k"], x["g"], delta.to(dtype), states.to(dtype), 0.3, geo, seqs, None, block_v)
        with poisoned_allocations(monkeypatch):
            direct, transposed = output_fwd(*args), output_fwd(*args, transposed=True)
        errors.append(((transposed.double() - direct.double()).norm() / direct.double().norm()).item())
    assert launched == ["output_fwd_kernel", "output_fwd_t_kernel"] * 2
    return errors


@pytest.mark.parametrize(("n_h", "T", "K", "V", "dtype", "gated"), [
    (1, 70, 32, 16, torch.float32, True), (2, 45, 64, 32, torch.float16, True),
    (3, 50, 32, 64, torch.float16, True), (4, 33, 16, 32, torch.float32, True),
    (2, 45, 64, 32, torch.float16, False), (3, 23, 32, 16, torch.float32, False),
])  # fmt: skip
def test_transposed_output_matches_direct(n_h, T, K, V, dtype, gated, monkeypatch):
    """o agrees to fp32 accumulation order (fp32) or to o's own fp16 rounding, with and without the gate
    (whose absence takes the kernel's other product order), also on V tiles narrower than V."""
    for err in transposed_against_direct(monkeypatch, n_h, T, K, V, dtype, gated):
        assert err < (1e-6 if dtype == torch.float32 else 2e-3), err


@pytest.mark.parametrize(("n_h", "T", "gated"), [(1, 41, True), (3, 50, False)])
def test_transposed_output_matches_reference_fp16(n_h, T, gated):
    inputs = make_inputs(2, T, 2, 32, 32, n_h, dtype=torch.float16, gated=gated)
    check_against_reference(inputs, n_h, None, 5e-3, 1e-2, 2e-2, kernel=variant_kernel("default+otrans"))


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("variant", "n_h", "K"), [
    ("default+obk=64+dbv=128", 2, 128), ("default+obk=32+obv=128+dbv=128", 3, 64),
    ("default+obk=64+obv=128", 2, 128), ("default+obv=128", 1, 128), ("default+otrans", 3, 128),
    ("default+otrans", 3, 64), ("default+otrans", 1, 128),
])  # fmt: skip
def test_gpu_output_tiles_bf16_match_reference(variant, n_h, K):
    check_gpu_bf16(variant, n_h, K)


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "T", "K", "gated"), [(2, 301, 64, False), (3, 177, 128, False),
                                                     (4, 99, 64, False), (2, 301, 64, True)])  # fmt: skip
def test_gpu_transposed_output_matches_direct_bf16(n_h, T, K, gated, monkeypatch):
    """bf16 δ and states, as the default stores them: without the gate the first form of the transposed kernel
    gave o 0.71 relative RMS off the direct kernel's at [2,301,4,64], n_h = 2 (H200, Triton 3.6)."""
    for err in transposed_against_direct(monkeypatch, n_h, T, K, K, torch.bfloat16, gated, device="cuda"):
        assert err < 1e-2, err


@pytest.mark.gpu
def test_gpu_output_tiles_varlen_and_no_gate():
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, 3, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 3, cu, *ISSUE_TOL, kernel=variant_kernel("default+obk=64"))
    inputs = make_inputs(2, 250, 4, 64, 64, 2, gated=False, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 2, None, *ISSUE_TOL, kernel=variant_kernel("default+obv=128"))
