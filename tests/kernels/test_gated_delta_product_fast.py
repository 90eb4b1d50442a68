"""Variant strings beyond save_states/lowp: the block-wise UT transform ``fastwy`` and launch overrides.

CPU (interpreter): ``fastwy`` must give wy_fwd's T, W, U up to fp32 rounding and, end to end, the fp64
oracle's results (odd T, several chunks, varlen with an empty document, n_h = 1..4, gated or not, gates
near 0 and 1, β ∈ (0, 2), NaN-poisoned allocations); launch keys must parse, round-trip and reach the
kernels. GPU: the issue's tolerances in bf16 at K = V = 128.
"""

from __future__ import annotations

import pytest
import torch

from titan_delta.testing import assert_rel_close
from titan_delta_kernels.gated_delta_product import api, gated_delta_product_triton
from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout
from titan_delta_kernels.gated_delta_product.options import GdpOptions, parse_options
from titan_delta_kernels.gated_delta_product.wy_fast import wy_fwd_fast
from titan_delta_kernels.gated_delta_product.wy_fwd import wy_fwd

from .test_gated_delta_product_triton import check_against_reference, make_inputs, random_cu_seqlens
from .test_gated_delta_product_variants import FP16_TOL, check_poisoned

ISSUE_TOL = (5e-3, 1e-2, 2e-2)
# ``default`` as GdpOptions fields (options.DEFAULT_FLAGS)
DEFAULT_OPTIONS = dict(save_states=True, fastwy=True, lowp_safe=True, bf16x3=True, kslice=True, wyseries=True,
                       dkp16=True, w16=True, sflean=True, sfs16=True, sbw16=True,
                       otrans=True, wyhoist=True)  # fmt: skip


def variant_kernel(variant: str):
    def run(*args, **kwargs):
        return gated_delta_product_triton(*args, variant=variant, **kwargs)

    return run


def chunked_inputs(B: int, T: int, n_h: int, K: int, V: int, cu: list[int] | None = None, device: str = "cpu",
                   **make_kw):  # fmt: skip
    """Fresh inputs (``make_inputs``, 2 heads) with their chunk geometry and sequence layout (``cu``: document
    boundaries, B = 1), for tests that call the transform or state kernels directly."""
    inputs = make_inputs(B, T, 2, K, V, n_h, device=device, **make_kw)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    geo = chunk_geometry(n_h)
    return inputs, geo, sequence_layout(B, T, cu_t, geo, torch.device(device))


def check_gpu_bf16(variant: str, n_h: int, K: int) -> None:
    """A variant in bf16 on the GPU against the fp64 oracle at the issue's tolerances ([2, 257, 4, K = V])."""
    inputs = make_inputs(2, 257, 4, K, K, n_h, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0.0))
    inputs["beta"] = inputs["beta"].to(torch.bfloat16)
    check_against_reference(inputs, n_h, None, *ISSUE_TOL, kernel=variant_kernel(variant))


def check_gpu_far_from_unit_scale(variant: str, scale: float) -> None:
    """A variant in bf16 on the GPU with v (and so U, δ, the states and ∂L/∂δ) scaled far from 1, where fp16
    storage without per-row or per-column scales would lose or overflow ([2, 257, 4, 128], n_h = 2)."""
    inputs = make_inputs(2, 257, 4, 128, 128, 2, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0.0))
    inputs["v"] = (inputs["v"].float() * scale).to(torch.bfloat16)
    inputs["initial_state"] = inputs["initial_state"] * scale
    check_against_reference(inputs, 2, None, *ISSUE_TOL, kernel=variant_kernel(variant))


def check_gpu_varlen_and_gate_extremes(variant: str) -> None:
    """A variant in bf16 on the GPU: five documents (one of a single token) at n_h = 3, then log gates near 0
    and below −30 at n_h = 2, K = V = 128, at the issue's tolerances."""
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, 3, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 3, cu, *ISSUE_TOL, kernel=variant_kernel(variant))
    for gate_range in [(-1e-6, 0.0), (-60.0, -30.0)]:
        inputs = make_inputs(2, 250, 4, 128, 128, 2, device="cuda", dtype=torch.bfloat16,
                             gate_range=gate_range)  # fmt: skip
        check_against_reference(inputs, 2, None, *ISSUE_TOL, dg_floor=1e-3, kernel=variant_kernel(variant))


@pytest.mark.parametrize(("n_h", "T", "cu"), [(1, 70, None), (3, 23, [0, 5, 5, 23]), (4, 18, None)])
def test_fastwy_transform_matches_wy_fwd(n_h, T, cu):
    """T, W, U of the block-wise transform against the 64×64 one (fp32: rounding-level differences)."""
    inputs, geo, seqs = chunked_inputs(1 if cu else 2, T, n_h, 32, 16, cu, gate_range=(-2.0, 0.0))
    k, v, g, beta = inputs["k"], inputs["v"], inputs["g"], inputs["beta"]
    for name, a, b in zip("TWU", wy_fwd_fast(k, v, beta, g, geo, seqs), wy_fwd(k, v, beta, g, geo, seqs),
                          strict=True):  # fmt: skip
        assert_rel_close(a, b, 1e-6, name)


@pytest.mark.parametrize(("n_h", "T", "gated"), [(1, 70, True), (2, 37, True), (3, 23, False)])
def test_fastwy_matches_reference(n_h, T, gated):
    """Several chunks per sequence at n_h = 1, 2 (C = 64, 32 tokens) and an ungated odd T at n_h = 3."""
    inputs = make_inputs(1, T, 2, 16, 32, n_h, gated=gated)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5, kernel=variant_kernel("fastwy"))


@pytest.mark.parametrize("gate_range", [(-1e-6, 0.0), (-1e4, -1e3)])
def test_fastwy_gates_near_one_and_zero(gate_range):
    inputs = make_inputs(1, 22, 1, 16, 16, 2, gate_range=gate_range)
    check_against_reference(inputs, 2, None, 1e-5, 1e-5, 1e-4, kernel=variant_kernel("fastwy"))


def test_fastwy_varlen_lowp_poisoned(monkeypatch):
    """save_states+lowp+fastwy + launch keys, fp16, documents incl. an empty one, NaN-poisoned buffers."""
    cu = torch.tensor([0, 1, 17, 17, 29], dtype=torch.int32)
    inputs = make_inputs(1, 29, 2, 16, 32, 3, num_seqs=4, dtype=torch.float16)
    kernel = variant_kernel("save_states+lowp+fastwy+sbv=16+sstages=2+gwarps=4+wywarps=2")
    check_poisoned(kernel, inputs, 3, cu, FP16_TOL, monkeypatch)


def test_fastwy_varlen_fp32_random_documents():
    cu = random_cu_seqlens(40, 3)
    inputs = make_inputs(1, 40, 2, 16, 16, 2, num_seqs=3)
    check_against_reference(inputs, 2, cu, 1e-5, 1e-5, 1e-5, kernel=variant_kernel("fastwy+sbv=16"))


def test_fastwy_falls_back_for_128_step_blocks():
    """n_h ≥ 5 has 128-step blocks: fastwy runs wy_fwd there, bitwise."""
    inputs = make_inputs(1, 7, 1, 16, 16, 5)
    k, v, g, beta = inputs["k"], inputs["v"], inputs["g"], inputs["beta"]
    geo = chunk_geometry(5)
    seqs = sequence_layout(1, 7, None, geo, k.device)
    for a, b in zip(wy_fwd_fast(k, v, beta, g, geo, seqs), wy_fwd(k, v, beta, g, geo, seqs), strict=True):
        assert torch.equal(a, b)


def test_variant_strings_parse_round_trip_and_refuse():
    opts = parse_options("lowp, fastwy+sbv=64+swarps=8+sstages=1+wywarps=2+gwarps=4")
    assert opts == GdpOptions(lowp=True, fastwy=True, state_block_v=64, state_warps=8, state_stages=1,
                              wy_warps=2, grad_warps=4)  # fmt: skip
    assert parse_options(opts.text()) == opts
    assert parse_options(opts.launch_text()) == GdpOptions(**{**opts.__dict__, "lowp": False})
    default_text = ("save_states+fastwy+lowp_safe+bf16x3+kslice+wyseries+dkp16+w16+sflean+sfs16+sbw16"
                    "+otrans+wyhoist")
    assert parse_options("default").text() == default_text == parse_options("").text()
    assert parse_options("plain").text() == "plain"
    assert parse_options("sbv=64") == GdpOptions(**DEFAULT_OPTIONS, state_block_v=64)
    assert parse_options("plain+sbv=64").text() == "plain+sbv=64"
    assert parse_options("fastwy") == GdpOptions(fastwy=True)  # named flags replace the default ones
    assert parse_options("default+lowp") == GdpOptions(**DEFAULT_OPTIONS, lowp=True)
    for bad, message in [("fast", "unknown"), ("sbv=48", "bad"), ("sbv=x", "bad"), ("bv=64", "unknown"),
                         ("swarps=8", "illegal memory access"), ("sbv=32+swarps=8", "refused"),
                         ("sstages=1", "BV=32 and 1 stage"), ("sbv=32+sstages=1", "refused"),
                         ("sbv=16+sstages=1", "BV=16 and 1 stage returned NaN")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            parse_options(bad)
    assert "sbv=64" in api.parse_variant("lowp+sbv=64")


def test_variant_argument_and_environment(monkeypatch):
    monkeypatch.setenv(api.VARIANT_ENV, "save_states+fastwy+sbv=64")
    expected = GdpOptions(save_states=True, fastwy=True, state_block_v=64)
    assert api.resolve_options(None, None, None) == expected
    assert api.resolve_options(False, True, None) == GdpOptions(lowp=True, fastwy=True, state_block_v=64)
    assert api.resolve_options(None, None, "lowp") == GdpOptions(lowp=True)  # the argument replaces the env


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2])
def test_gpu_fastwy_bf16_matches_reference(n_h):
    inputs = make_inputs(2, 257, 4, 128, 128, n_h, device="cuda", dtype=torch.bfloat16,
                         gate_range=(-0.5, 0.0))  # fmt: skip
    inputs["beta"] = inputs["beta"].to(torch.bfloat16)
    check_against_reference(inputs, n_h, None, *ISSUE_TOL, kernel=variant_kernel("save_states+lowp+fastwy"))


@pytest.mark.gpu
def test_gpu_fastwy_varlen_n_h3_and_gate_extremes():
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, 3, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 3, cu, *ISSUE_TOL, kernel=variant_kernel("save_states+lowp+fastwy"))
    for gate_range in [(-1e-6, 0.0), (-60.0, -30.0)]:
        inputs = make_inputs(2, 250, 4, 128, 128, 2, device="cuda", dtype=torch.bfloat16,
                             gate_range=gate_range)  # fmt: skip
        check_against_reference(inputs, 2, None, *ISSUE_TOL, dg_floor=1e-3, kernel=variant_kernel("fastwy"))
