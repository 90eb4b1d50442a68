"""The ``kslice`` flag (in the default since the sixth session): the backward's gradient kernels with K
streamed in slices (``grads_sliced.py``).

CPU (interpreter): the sliced kernels must give ``grads.py``'s outputs on the same inputs up to fp32
rounding (one slice, several, a ragged last slice; dk's rows as the ∂L/∂A scratch or a buffer of its own),
and end to end the fp64 oracle's results (n_h = 1, 2, 3, 5, gated or not, odd T, varlen with an empty
document, NaN-poisoned allocations); the flag must parse and switch ``chunk.py`` to the sliced kernels.
GPU: the issue's tolerances in bf16 at K = V = 128 (two slices, dk's rows as the scratch, 128-register cap).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from titan_delta.testing import assert_rel_close
from titan_delta_kernels.gated_delta_product import chunk, grads, grads_sliced
from titan_delta_kernels.gated_delta_product._common import chunk_geometry, sequence_layout
from titan_delta_kernels.gated_delta_product.options import DEFAULT_FLAGS, GdpOptions, parse_options
from titan_delta_kernels.gated_delta_product.wy_fwd import wy_fwd

from .test_gated_delta_product_fast import DEFAULT_OPTIONS, ISSUE_TOL, variant_kernel
from .test_gated_delta_product_triton import (
    check_against_reference,
    make_inputs,
    random_cu_seqlens,
    run_with_grads,
)
from .test_gated_delta_product_variants import FP16_TOL, check_poisoned

KSLICE = "default+kslice"


def backward_inputs(n_h: int, T: int, K: int, V: int, cu: list[int] | None, gated: bool = True, H: int = 2):
    """Inputs of ``chunk_grads`` at fp32: real T from the forward transform, the rest random."""
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    inputs = make_inputs(1 if cu is not None else 2, T, H, K, V, n_h, gated=gated)
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    geo = chunk_geometry(n_h)
    seqs = sequence_layout(q.shape[0], T, cu_t, geo, q.device)
    t_inv, _, _ = wy_fwd(k, v, beta, g, geo, seqs)
    v_new, d_delta = torch.randn_like(v), torch.randn_like(v)
    d_out = torch.randn(*q.shape[:3], V)
    states = torch.randn(seqs.grid_chunks, H, K, V)
    d_states = torch.randn(seqs.grid_chunks, H, K, V)
    return (q, k, v, g, beta, t_inv, v_new, states, d_states, d_delta, d_out, K**-0.5), geo, seqs


# (n_h, T, K, V, BKS, cu_seqlens, gated): 2 slices; ragged 32 + 16 with an empty document (scratch buffer
# of its own, K < BT); K = BT = 64, one slice, dk's rows as the scratch; K = 16 ungated; 3 slices at n_h = 5.
CASES = [
    (2, 37, 32, 16, 16, None, True),
    (3, 23, 48, 16, 32, [0, 5, 5, 23], True),
    (1, 70, 64, 32, 64, None, True),
    (2, 19, 16, 16, 64, None, False),
    (5, 7, 48, 16, 16, None, True),
]


@pytest.mark.parametrize(("n_h", "T", "K", "V", "bks", "cu", "gated"), CASES)
def test_sliced_kernels_match_grads(n_h, T, K, V, bks, cu, gated):
    """Each output of both sliced kernels against grads.py's on the same inputs (fp32 rounding only)."""
    args, geo, seqs = backward_inputs(n_h, T, K, V, cu, gated)
    q, k, v, g, beta, t_inv, v_new, states, d_states, d_delta, d_out, scale = args
    ref = grads.dqkw(q, k, g, v_new, states, d_states, d_delta, d_out, scale, geo, seqs)
    got = grads_sliced.dqkw(q, k, g, v_new, states, d_states, d_delta, d_out, scale, geo, seqs, block_k=bks)
    for name, a, b in zip(("dq", "dk_part", "dw", "dG_step", "dG_tok"), got, ref, strict=True):
        assert torch.isfinite(a).all(), name
        assert_rel_close(a, b, 1e-5, name)
    _dq, dk_part, dw, dG_step, dG_tok = ref
    ref = grads.wy_bwd(k, v, g, beta, t_inv, d_delta, dk_part, dw, dG_step, dG_tok, geo, seqs)
    got = grads_sliced.wy_bwd(k, v, g, beta, t_inv, d_delta, dk_part, dw, dG_step, dG_tok, geo, seqs,
                              block_k=bks)  # fmt: skip
    for name, a, b in zip(("dk", "dv", "dg", "dbeta"), got, ref, strict=True):
        if b is None:
            assert a is None and not gated
            continue
        assert torch.isfinite(a).all(), name
        assert_rel_close(a, b, 1e-5, name)


@pytest.mark.parametrize(
    ("n_h", "T", "K", "bks", "gated"),
    [(1, 70, 16, 64, True), (2, 37, 32, 16, True), (3, 23, 48, 32, False), (5, 7, 16, 64, True)],
)
def test_kslice_matches_reference(n_h, T, K, bks, gated, monkeypatch):
    """End to end: several chunks at n_h = 1, 2 slices at K = 32, a ragged last slice at K = 48."""
    monkeypatch.setattr(grads_sliced, "KSLICE_BLOCK_K", bks)
    inputs = make_inputs(1, T, 1, K, 16, n_h, gated=gated)
    check_against_reference(inputs, n_h, None, 1e-5, 1e-5, 1e-5, kernel=variant_kernel(KSLICE))


@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_kslice_varlen_with_empty_document(n_h, monkeypatch):
    monkeypatch.setattr(grads_sliced, "KSLICE_BLOCK_K", 16)
    cu = torch.tensor([0, 7, 7, 20], dtype=torch.int32)
    inputs = make_inputs(1, 20, 1, 32, 16, n_h, num_seqs=3)
    check_against_reference(inputs, n_h, cu, 1e-5, 1e-5, 1e-5, kernel=variant_kernel(KSLICE))


def test_kslice_lowp_fp16_poisoned(monkeypatch):
    """bf16-class intermediates (fp16 on the interpreter), random documents, NaN-poisoned allocations and
    4 warps: every output element must be written, the scratch read back only where it was written."""
    monkeypatch.setattr(grads_sliced, "KSLICE_BLOCK_K", 16)
    cu = random_cu_seqlens(29, 3)
    inputs = make_inputs(1, 29, 2, 32, 16, 3, num_seqs=3, dtype=torch.float16)
    check_poisoned(variant_kernel("save_states+lowp+kslice+gwarps=4"), inputs, 3, cu, FP16_TOL, monkeypatch)


def test_kslice_flag_parses_and_switches_the_kernels(monkeypatch):
    assert "kslice" in DEFAULT_FLAGS
    opts = parse_options("default+kslice+gwarps=4")
    assert opts == GdpOptions(**DEFAULT_OPTIONS, grad_warps=4)
    assert parse_options(opts.text()) == opts
    assert parse_options("default").kslice and not parse_options("save_states+fastwy+bf16x3").kslice
    calls = {"grads": 0, "sliced": 0}
    for name, module in (("grads", grads), ("sliced", grads_sliced)):
        real = module.chunk_grads

        def counting(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            assert args[-1] == 4  # gwarps reaches the launcher as num_warps
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, "chunk_grads", counting)
    inputs = make_inputs(1, 9, 1, 16, 16, 2)
    for variant in ("save_states+fastwy+bf16x3+gwarps=4", "default+gwarps=4"):
        leaves = [inputs[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
        o, _ = variant_kernel(variant)(*leaves, num_householder=2)
        o.sum().backward()
    assert calls == {"grads": 1, "sliced": 1}
    assert chunk.grads_sliced is grads_sliced


def test_slice_width_and_register_cap():
    assert grads_sliced.slice_width(128) == 64
    assert grads_sliced.slice_width(48) == 64  # one masked slice, like grads.py's single tile
    assert grads_sliced.slice_width(48, 32) == 32  # ragged: 32 + 16
    assert grads_sliced.slice_width(16, 64) == 16
    for bad in (8, 24, 0):
        with pytest.raises(ValueError, match="power of two"):
            grads_sliced.slice_width(64, bad)
    k = torch.empty(1, 8, 2, 128)
    seqs = sequence_layout(1, 4, None, chunk_geometry(2), k.device)

    def config(n_h, warps, cap=None):
        return grads_sliced._launch_config(k, 128, True, chunk_geometry(n_h), seqs, warps, None, cap)[0]

    assert config(2, None)["num_warps"] == 4 and "maxnreg" not in config(2, None)  # 4 warps: no cap
    assert config(2, 8)["maxnreg"] == 128
    assert "maxnreg" not in config(5, 8)  # 128-step blocks: no cap
    assert config(2, 4, 168)["maxnreg"] == 168
    k64 = torch.empty(1, 8, 2, 64)

    def config64(warps, cap=None, dqkw_cap=True):
        geo = chunk_geometry(2)
        return grads_sliced._launch_config(k64, 64, True, geo, seqs, warps, None, cap, dqkw_cap)[0]

    assert config64(None)["maxnreg"] == grads_sliced.KSLICE_DQKW_MAX_REGISTERS  # dqkw's default at K <= 64
    assert "maxnreg" not in config64(None, dqkw_cap=False)  # wy_bwd stays uncapped
    assert "maxnreg" not in config64(None, 0)  # dqregs=0 / gregs=0: no cap
    assert config64(8)["maxnreg"] == 128  # the 8-warp cap comes first
    assert parse_options("default+dqregs=160").dqkw_max_registers == 160
    with pytest.raises(ValueError):
        parse_options("default+dqregs=100")


def test_state_bwd_value_tile_default(monkeypatch):
    """64-column V tiles in the reverse state pass at n_h = 1 only (one wave, see state.py); sbv overrides."""
    from titan_delta_kernels.gated_delta_product import cost, options, state

    # the Triton-free copies (cost model, option checks) mirror the kernels' defaults
    assert cost.STATE_BWD_BLOCK_V_NH1 == state.STATE_BWD_BLOCK_V_NH1 == state.STATE_BWD_BLOCK_V_PLANES
    assert cost.STATE_BLOCK_V == options.STATE_BLOCK_V_DEFAULT == state.STATE_BLOCK_V

    seen = []
    original = state.launch

    def spy(kernel, grid, *args, **kwargs):
        seen.append((kernel.fn.__name__, kwargs["BV"], grid))
        return original(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(state, "launch", spy)
    for n_h, variant, bwd_bv in ((1, "default", 64), (2, "default", 32), (1, "default+sbv=16", 16)):
        seen.clear()
        inputs = make_inputs(1, 9, 1, 16, 128, n_h)
        leaves = [inputs[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
        o, _ = variant_kernel(variant)(*leaves, num_householder=n_h)
        o.sum().backward()
        fwd_bv = 16 if variant.endswith("sbv=16") else 32
        assert ("state_fwd_lean_kernel", fwd_bv, (1, 1, 128 // fwd_bv)) in seen  # sflean: default
        # fp32 inputs keep fp32 W: the lean reverse pass (sbw16) needs row-scaled fp16 W
        assert ("state_bwd_kernel", bwd_bv, (1, 1, 128 // bwd_bv)) in seen


@pytest.mark.parametrize(("variant", "caps"), [
    ("default", {"dqkw_sliced_kernel": 168, "wy_bwd_hoisted_kernel": None}),
    ("default+dqregs=0", {"dqkw_sliced_kernel": None, "wy_bwd_hoisted_kernel": None}),
    ("default+gregs=160", {"dqkw_sliced_kernel": 160, "wy_bwd_hoisted_kernel": 160}),
    ("default+gregs=160+dqregs=192", {"dqkw_sliced_kernel": 192, "wy_bwd_hoisted_kernel": 160}),
    ("kslice+gregs=160+dqregs=192", {"dqkw_sliced_kernel": 192, "wy_bwd_sliced_kernel": 160}),
])
def test_gradient_register_caps_reach_their_launches(monkeypatch, variant, caps):
    """dqkw's own cap (K <= 64) and the dqregs / gregs overrides arrive at the right launch (wy_bwd's is the
    hoisted kernel at these one-tile shapes, the sliced one without ``wyhoist``); the results stay the
    reference's (the interpreter ignores the cap)."""
    seen = {}
    original = grads_sliced.launch

    def spy(kernel, grid, *args, **kwargs):
        seen[kernel.fn.__name__] = kwargs.get("maxnreg")
        return original(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(grads_sliced, "launch", spy)
    inputs = make_inputs(1, 9, 1, 16, 16, 2)
    leaves = [inputs[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
    o, _ = variant_kernel(variant)(*leaves, num_householder=2)
    o.sum().backward()
    assert seen == caps


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "variant"), [(1, KSLICE), (2, KSLICE), (2, "default+kslice+gwarps=4")])
def test_gpu_kslice_bf16_matches_reference(n_h, variant):
    inputs = make_inputs(2, 257, 4, 128, 128, n_h, device="cuda", dtype=torch.bfloat16,
                         gate_range=(-0.5, 0.0))  # fmt: skip
    check_against_reference(inputs, n_h, None, *ISSUE_TOL, kernel=variant_kernel(variant))


@pytest.mark.gpu
def test_gpu_kslice_varlen_n_h3():
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, 3, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_against_reference(inputs, 3, cu, *ISSUE_TOL, kernel=variant_kernel(KSLICE))


@pytest.mark.parametrize("dqbk", [16, 32])
def test_dqkw_slice_width_reaches_dqkw_alone_and_matches_reference(monkeypatch, dqbk):
    """``dqbk=N``: dqkw streams K in N-column slices (several at K = 64), wy_bwd keeps its own width; the
    results stay the fp64 oracle's."""
    seen = {}
    original = grads_sliced.launch

    def spy(kernel, grid, *args, **kwargs):
        seen[kernel.fn.__name__] = kwargs["BKS"]
        return original(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(grads_sliced, "launch", spy)
    inputs = make_inputs(1, 37, 2, 64, 16, 2)
    check_against_reference(inputs, 2, None, 1e-5, 1e-5, 1e-5, kernel=variant_kernel(f"default+dqbk={dqbk}"))
    assert seen == {"dqkw_sliced_kernel": dqbk, "wy_bwd_hoisted_kernel": 64}  # K = 64: one wy_bwd tile
    assert parse_options(f"default+dqbk={dqbk}").dqkw_block_k == dqbk
    with pytest.raises(ValueError):
        parse_options("default+dqbk=48")


def test_wy_bwd_launch_keys(monkeypatch):
    """``wystages`` reaches wy_bwd's launch as its pipelining depth; ``gwarps=2`` is a valid launch; both
    keep the results (fp32, against the oracle)."""
    opts = parse_options("default+wystages=1+gwarps=2")
    assert (opts.wy_bwd_stages, opts.grad_warps) == (1, 2) and parse_options(opts.text()) == opts
    opts = dataclasses.replace(opts, wyhoist=False)  # the sliced kernel (the hoisted one has no loops)
    seen = []
    real = grads_sliced.launch

    def recording(kernel, grid, *args, **kwargs):
        if kernel is grads_sliced.wy_bwd_sliced_kernel:
            seen.append((kwargs["num_stages"], kwargs["num_warps"]))
        return real(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(grads_sliced, "launch", recording)
    inputs = make_inputs(1, 23, 2, 16, 16, 2)
    check_against_reference(inputs, 2, None, 1e-5, 1e-5, 1e-5, kernel=variant_kernel(opts.text()))
    assert seen == [(1, 2)]
    # the default depth: 3 where the K loops run more than once, 2 for one slice, 1 past K = 128
    assert [grads_sliced.wy_bwd_num_stages(K, 64) for K in (64, 128, 256)] == [2, 3, 1]


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_gpu_wy_bwd_three_stages_agree_with_two(n_h):
    """The default 3-stage wy_bwd at K = 128 against 2 stages on the same inputs: pipelining moves loads, not
    sums, so the gradients must agree to fp32 rounding (a miscompiled pipeline, as seen for dqkw with a 16-bit
    δ, would be off by percents)."""
    inputs = make_inputs(2, 300, 4, 128, 128, n_h, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0))
    d_out = torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.float64)
    d_final = torch.randn_like(inputs["initial_state"], dtype=torch.float64)
    three = run_with_grads(variant_kernel("default"), inputs, n_h, None, d_out, d_final)
    two = run_with_grads(variant_kernel("default+wystages=2"), inputs, n_h, None, d_out, d_final)
    assert torch.equal(three[0], two[0])
    for name in three[2]:
        a, b = three[2][name].double(), two[2][name].double()
        assert ((a - b).norm() / b.norm()).item() < 1e-5, name
