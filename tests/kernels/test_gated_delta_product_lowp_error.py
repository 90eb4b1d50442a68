"""``lowp``'s error budget: the CPU emulator of tools/gdp_lowp_error.py and the ``lowp_safe`` variant.

The emulator transcribes every kernel stage (forward and backward) in float64 with switchable roundings;
without rounding it must reproduce the fp64 reference exactly, or its error tables mean nothing.
``lowp_safe`` (W and U fp32, δ and the backward's intermediates in the input dtype) is checked like
``lowp`` in test_gated_delta_product_variants.py: on the interpreter in fp16 against fp64; so are
``lowp_state`` (only state_bwd's Wᵀ·dδ in the input dtype) and ``bf16x3`` (that product as 3 bf16 products),
whose forward must be bitwise the default's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from titan_delta_kernels.gated_delta_product import gated_delta_product_triton
from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout
from titan_delta_kernels.gated_delta_product.chunk import gdp_chunk_fwd
from titan_delta_kernels.gated_delta_product.options import GdpOptions, parse_options

from .test_gated_delta_product_triton import (
    NAMES,
    check_against_reference,
    make_inputs,
    random_cu_seqlens,
    run_with_grads,
)
from .test_gated_delta_product_variants import FP16_TOL

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gdp_lowp_error.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("gdp_lowp_error", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gdp_lowp_error", module)
    spec.loader.exec_module(module)
    return module


def variant_kernel(variant: str):
    def run(*args, **kwargs):
        return gated_delta_product_triton(*args, variant=variant, **kwargs)

    return run


# ---------------------------------------------------------------- the emulator
@pytest.mark.parametrize(("n_h", "T", "gated"),
                         [(1, 150, True), (2, 45, False), (3, 45, True), (4, 45, True)])  # fmt: skip
def test_emulator_without_rounding_is_the_reference(n_h, T, gated):
    """Forward and every gradient of the kernels' formulas, several chunks with a partial last one."""
    tool = load_tool()
    cfg = tool.Config("t", "t", 2, T, 2, 16, 32, n_h, gated, (-1.0, 0.0), False)
    x = {n: (None if t is None else t.double()) for n, t in tool.make_inputs(cfg, 0).items()}
    args = [x[n] for n in ("q", "k", "v", "g", "beta", "h0", "d_out", "d_final")]
    ref = tool.reference(*args, n_h, 0.25)
    out = tool.emulate(*args, n_h, 0.25, tool.Rounding(exact=True))
    assert set(out) == set(ref) - ({"dg"} if not gated else set())
    for name, value in out.items():
        assert tool.rel_rms(value, ref[name]) < 1e-12, name


def test_emulator_rounding_helpers():
    tool = load_tool()
    x = torch.tensor([1.0 + 2**-11, 1.0 + 2**-12, -(1.0 + 3 * 2**-12), 3.0], dtype=torch.float64)
    assert tool.tf32(x).tolist() == [1.0 + 2**-10, 1.0, -(1.0 + 2**-10), 3.0]  # ties away from zero
    assert tool.bf16(torch.tensor([1.0 + 2**-9], dtype=torch.float64)).item() == 1.0
    lowp = tool.Rounding(tool.LOWP)
    assert lowp.store(x, "W").tolist() == tool.bf16(x).tolist()
    assert tool.Rounding().store(x, "W").tolist() == x.float().double().tolist()
    assert tool.Rounding(exact=True).operand(x, "W") is x


def test_emulator_lowp_state_and_bf16x3_sites():
    """lowp_state rounds only Wᵀ·dδ's operands (the forward is the default's); bf16x3 is ~2^-16 exact."""
    tool = load_tool()
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(2, 64, 16, generator=gen, dtype=torch.float64).float().double()
    dd = torch.randn(2, 64, 8, generator=gen, dtype=torch.float64)
    exact = tool.mt(w) @ dd
    err = {name: tool.rel_rms(rnd.wt_dd(w, dd), exact) for name, rnd in (
        ("default", tool.Rounding()), ("lowp_state", tool.Rounding(tool.LOWP_STATE)),
        ("bf16x3", tool.Rounding(bf16x3=True)), ("lowp", tool.Rounding(tool.LOWP, bf16x3=True)))}  # fmt: skip
    assert err["bf16x3"] < 2e-5 < err["default"] < 1e-3 < err["lowp_state"] == err["lowp"] < 5e-3, err
    cfg = tool.Config("t", "t", 1, 40, 2, 16, 16, 2, True, (-1.0, 0.0), True)
    x = tool.make_inputs(cfg, 0)
    args = [x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], x["d_out"].to(torch.bfloat16),
            x["d_final"].float()]  # fmt: skip
    base = tool.emulate(*args, 2, 0.25, tool.Rounding())
    for rnd in (tool.Rounding(tool.LOWP_STATE), tool.Rounding(bf16x3=True)):
        out = tool.emulate(*args, 2, 0.25, rnd)
        assert torch.equal(out["o"], base["o"]) and torch.equal(out["final"], base["final"])
        assert not torch.equal(out["dh0"], base["dh0"])


# ---------------------------------------------------------------- lowp_safe
def test_lowp_safe_parses():
    assert parse_options("lowp_safe") == GdpOptions(lowp_safe=True)
    assert parse_options("default+lowp_safe") == parse_options("default")  # in the default since session 11
    assert parse_options("save_states+kslice+lowp_safe") == GdpOptions(save_states=True, kslice=True,
                                                                       lowp_safe=True)  # fmt: skip
    assert parse_options("lowp_safe+sbv=64").launch_text() == "lowp_safe+sbv=64"


@pytest.mark.parametrize(("variant", "n_h", "T", "gated"), [
    ("lowp_safe", 1, 21, True), ("lowp_safe", 2, 19, False), ("save_states+lowp_safe", 3, 23, True),
])  # fmt: skip
def test_lowp_safe_fp16_matches_reference(variant, n_h, T, gated):
    inputs = make_inputs(2, T, 2, 16, 32, n_h, dtype=torch.float16, gated=gated)
    check_against_reference(inputs, n_h, None, *FP16_TOL, kernel=variant_kernel(variant))


def test_lowp_safe_varlen_matches_reference():
    cu = random_cu_seqlens(24, 4)
    inputs = make_inputs(1, 24, 2, 16, 16, 2, num_seqs=4, dtype=torch.float16)
    check_against_reference(inputs, 2, cu, *FP16_TOL, kernel=variant_kernel("save_states+lowp_safe"))


def test_lowp_safe_dtypes_and_fake():
    """W and U fp32, δ in the input dtype; the fake implementation agrees."""
    inputs = make_inputs(1, 10, 2, 16, 32, 3, num_seqs=2, dtype=torch.float16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    args = (*(inputs[n] for n in NAMES), cu, 3, 0.5, True, False, "lowp_safe")
    torch.library.opcheck(gdp_chunk_fwd, args, test_utils=("test_schema", "test_faketensor"))
    _, _, _, w, u, states, v_new, *_ = gdp_chunk_fwd(*args)
    assert (w.dtype, u.dtype, states.dtype, v_new.dtype) == (torch.float32, torch.float32, torch.float16,
                                                             torch.float16)  # fmt: skip


def _varlen_fp16_case() -> tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor]:
    """Three fp16 documents (one empty) in 40 tokens, n_h = 2, with output and final-state cotangents."""
    cu = torch.tensor([0, 5, 5, 40], dtype=torch.int32)
    inputs = make_inputs(1, 40, 2, 16, 16, 2, num_seqs=3, dtype=torch.float16)
    d_out = torch.randn(1, 40, 2, 16, dtype=torch.float64)
    d_final = torch.randn(3, 2, 16, 16, dtype=torch.float64)
    return cu, inputs, d_out, d_final


def test_lowp_safe_save_states_is_bitwise_the_recomputation():
    """The backward's recomputed δ must have the saved δ's dtype (and so its bits)."""
    cu, inputs, d_out, d_final = _varlen_fp16_case()
    a = run_with_grads(variant_kernel("lowp_safe"), inputs, 2, cu, d_out, d_final)
    b = run_with_grads(variant_kernel("save_states+lowp_safe"), inputs, 2, cu, d_out, d_final)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for name in a[2]:
        assert torch.equal(a[2][name], b[2][name]), f"d{name} differs"


# ---------------------------------------------------------------- lowp_state and bf16x3
def test_lowp_state_and_bf16x3_parse():
    assert parse_options("lowp_state") == GdpOptions(lowp_state=True)
    assert parse_options("save_states+bf16x3+sbv=64").launch_text() == "bf16x3+sbv=64"
    launch = "fastwy+lowp_safe+bf16x3+kslice+wyseries+dkp16+w16+sflean+sfs16+sbw16+otrans+wyhoist+sbv=64"
    assert parse_options("default+sbv=64").launch_text() == launch
    modes = [parse_options(v).wt_mode() for v in ("default", "save_states", "lowp_state", "bf16x3",
                                                   "lowp_state+bf16x3", "default+lowp_state")]  # fmt: skip
    assert modes == [3, 0, 1, 3, 1, 1]  # bf16x3 is in the default since the fifth session


def state_bwd_inputs(dtype: torch.dtype, n_h: int = 2, T: int = 40, K: int = 16, V: int = 32):
    """Inputs of the reverse state pass alone: fp32 W and local ∂L/∂δ as the default path stores them."""
    from titan_delta_kernels.gated_delta_product import output, wy_fwd

    torch.manual_seed(1)
    x = make_inputs(1, T, 2, K, V, n_h, dtype=dtype)
    geo = chunk_geometry(n_h)
    seqs = sequence_layout(1, T, None, geo, torch.device("cpu"))
    _, w, _ = wy_fwd.wy_fwd(x["k"], x["v"], x["beta"], x["g"], geo, seqs, torch.float32)
    d_out = torch.randn(1, T, 2, V).to(dtype)
    dvl = output.dv_local(x["q"], x["k"], x["g"], d_out, 0.25, geo, seqs, torch.float32)
    return (x["q"], x["k"], w, x["g"], d_out, None, dvl, 0.25, geo, seqs)


def test_state_bwd_wt_modes():
    """On the interpreter fp32 products are exact: mode 3 (bf16x3) must land within ~2^-16 of mode 0, mode 1
    (operands in fp16 here) within fp16 rounding but not on it; for fp32 inputs mode 1 is mode 0."""
    from titan_delta_kernels.gated_delta_product.state import state_bwd

    args = state_bwd_inputs(torch.float16)
    out = {m: state_bwd(*args, wt_mode=m) for m in (0, 1, 3)}
    for i, name in enumerate(("d_chunk_states", "d_delta", "d_h0")):
        ref = out[0][i].double()
        rel = {m: ((out[m][i].double() - ref).norm() / ref.norm()).item() for m in (1, 3)}
        assert rel[3] < 1e-4 and 1e-6 < rel[1] < 5e-3, (name, rel)
    args32 = state_bwd_inputs(torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(state_bwd(*args32), state_bwd(*args32, wt_mode=1),
                                                    strict=True))  # fmt: skip
    with pytest.raises(ValueError, match="wt_mode"):
        state_bwd(*args32, wt_mode=2)


@pytest.mark.parametrize(("variant", "n_h", "T", "gated"), [
    ("lowp_state", 2, 19, False), ("save_states+lowp_state", 3, 23, True), ("bf16x3", 1, 21, True),
    ("save_states+lowp_safe+lowp_state+fastwy", 2, 19, True),
])  # fmt: skip
def test_lowp_state_fp16_matches_reference(variant, n_h, T, gated):
    inputs = make_inputs(2, T, 2, 16, 32, n_h, dtype=torch.float16, gated=gated)
    check_against_reference(inputs, n_h, None, *FP16_TOL, kernel=variant_kernel(variant))


def test_lowp_state_varlen_forward_is_the_default():
    """Storage as without them, and the forward (o, final state, W, U, δ) bitwise that of save_states alone
    (the default before fastwy joined it: fastwy changes the forward's rounding)."""
    cu, inputs, d_out, d_final = _varlen_fp16_case()
    a = run_with_grads(variant_kernel("save_states"), inputs, 2, cu, d_out, d_final)
    for variant in ("save_states+lowp_state", "save_states+bf16x3"):
        b = run_with_grads(variant_kernel(variant), inputs, 2, cu, d_out, d_final)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), variant
        for name in a[2]:
            assert torch.allclose(a[2][name].double(), b[2][name].double(), rtol=2e-2, atol=2e-2), name
    args = (*(inputs[n] for n in NAMES), cu, 2, 0.5, True, False, "lowp_state")
    torch.library.opcheck(gdp_chunk_fwd, args, test_utils=("test_schema", "test_faketensor"))
    _, _, _, w, u, _, v_new, *_ = gdp_chunk_fwd(*args)
    assert (w.dtype, u.dtype, v_new.dtype) == (torch.float32,) * 3


# ---------------------------------------------------------------- GPU (real shapes, bf16)
# GPU: the three configurations lowp failed as the default (2026-11-21) and a control; (n_h, T, K, gated,
# gate range, dg floor). The fastwy test takes the K = 128 ones only, where the benchmark runs.
GPU_CONFIGS = [
    (2, 301, 64, False, (-0.5, 0.0), 0.0),
    (4, 99, 64, False, (-0.5, 0.0), 0.0),
    (2, 250, 128, True, (-1e-6, 0.0), 1e-3),
    (2, 257, 128, True, (-0.5, 0.0), 0.0),
]


def check_bf16_config(variant: str, n_h, T, K, gated, gate_range, dg_floor) -> None:
    """bf16 inputs of one GPU_CONFIGS entry under ``variant`` against the reference, at the issue's
    tolerances (o, final state 5e-3; gradients 1e-2; g, β 2e-2)."""
    inputs = make_inputs(2, T, 4, K, K, n_h, gated=gated, device="cuda", dtype=torch.bfloat16,
                         gate_range=gate_range)  # fmt: skip
    if dg_floor == 0.0:
        inputs["beta"] = inputs["beta"].to(torch.bfloat16)
    check_against_reference(inputs, n_h, None, 5e-3, 1e-2, 2e-2, dg_floor=dg_floor,
                            kernel=variant_kernel(variant))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "T", "K", "gated", "gate_range", "dg_floor"), GPU_CONFIGS)
def test_gpu_lowp_safe_bf16_matches_reference(n_h, T, K, gated, gate_range, dg_floor):
    check_bf16_config("save_states+lowp_safe", n_h, T, K, gated, gate_range, dg_floor)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["save_states+lowp_state", "save_states+bf16x3"])
@pytest.mark.parametrize(("n_h", "T", "K", "gated", "gate_range", "dg_floor"), GPU_CONFIGS)
def test_gpu_lowp_state_bf16_matches_reference(variant, n_h, T, K, gated, gate_range, dg_floor):
    check_bf16_config(variant, n_h, T, K, gated, gate_range, dg_floor)


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "T", "K", "gated", "gate_range", "dg_floor"), GPU_CONFIGS[2:])
def test_gpu_lowp_state_fastwy_bf16_matches_reference(n_h, T, K, gated, gate_range, dg_floor):
    check_bf16_config("save_states+lowp_state+fastwy+wywarps=2", n_h, T, K, gated, gate_range, dg_floor)
