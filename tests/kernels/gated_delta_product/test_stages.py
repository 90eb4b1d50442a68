"""Single stages against their alternatives, through the whole op with one launch-table entry changed.

Each alternative is a kernel the launch table picks for other shapes (the general state passes where K is
not a power of two, the sliced wy_bwd where K or V > 64, the direct output kernel at n_h = 1), so running
it on the same inputs checks the choice for one shape changes no result: bitwise where the kernels run the
same products, within 16-bit rounding where they multiply differently. Also the launch table itself at the
benchmark's shapes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton

from titan_delta.testing import rel_rms_error
from titan_delta_kernels.gated_delta_product import chunk, gated_delta_product_triton
from titan_delta_kernels.gated_delta_product.launch_table import launch_table

from .helpers import launches, make_inputs, run_with_grads


def run_with(monkeypatch, inputs, n_h, changes=None, cu=None, seed=0):
    """(o, final state, grads) of the op with ``changes`` applied to its launch-table entry."""
    if changes:
        changed = lambda *key: dataclasses.replace(launch_table(*key), **changes)  # noqa: E731
        monkeypatch.setattr(chunk, "launch_table", changed)
    gen = torch.Generator(device=inputs["q"].device).manual_seed(seed)
    q, v, h0 = inputs["q"], inputs["v"], inputs["initial_state"]
    d_out = torch.randn(*q.shape[:3], v.shape[-1], device=q.device, dtype=torch.float64, generator=gen)
    d_final = torch.randn(h0.shape, device=q.device, dtype=torch.float64, generator=gen)
    try:
        with launches() as log:
            result = run_with_grads(gated_delta_product_triton, inputs, n_h, cu, d_out, d_final)
    finally:
        monkeypatch.undo()
    return result, {name for name, _ in log}


def max_error(a, b) -> float:
    pairs = [(a[0], b[0]), (a[1], b[1])] + [(a[2][n], b[2][n]) for n in a[2]]
    return max(rel_rms_error(x.double(), y.double()) for x, y in pairs)


def bitwise(a, b) -> bool:
    same = torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    return same and all(torch.equal(a[2][n], b[2][n]) for n in a[2])


def test_launch_table_at_the_benchmark_shapes():
    for K in (64, 128):
        for n_h in (1, 2, 3):
            bf16 = launch_table(K, K, n_h, torch.bfloat16, True)
            fp32 = launch_table(K, K, n_h, torch.float32, True)
            assert bf16.dot_precision == "tf32" and fp32.dot_precision == "tf32x3"
            assert bf16.wy_series and bf16.state_fwd_lean and bf16.state_bwd_lean and not fp32.state_bwd_lean
            assert bf16.state_fwd_block_v == (64 if K == 64 else 32)
            assert bf16.state_fwd_s16 == (K == 128) and not fp32.state_fwd_s16
            assert bf16.state_bwd_block_v == (64 if n_h == 1 else 32)
            assert bf16.output_transposed == fp32.output_transposed == (n_h >= 2)
            assert bf16.dqkw_stages == (1 if K == 128 else 2)
            assert bf16.dqkw_max_registers == (168 if K == 64 else None)
            assert bf16.wy_bwd_hoisted == (K == 64) and bf16.wy_bwd_stages == (3 if K == 128 else 2)
            assert bf16.wy_warps == bf16.output_warps == bf16.grad_warps == 4
            # fp32: its own rows, chosen for compile time (launch_table._fp32_launch)
            assert not fp32.wy_series and fp32.wy_block_v == 32 and fp32.state_fwd_lean
            assert fp32.state_fwd_block_v == 16 and fp32.state_bwd_block_v == (32 if K == 64 else 16)
            assert fp32.state_bwd_stages == (3 if K == 64 else 2)
            assert fp32.output_block_v == (64 if n_h >= 2 else 32)
            assert fp32.grad_block_k == fp32.grad_block_v == 16 and not fp32.wy_bwd_hoisted
            assert fp32.dqkw_stages == fp32.wy_bwd_stages == 1 and fp32.dqkw_max_registers is None
            assert fp32.wy_warps == fp32.output_warps == 8 and fp32.grad_warps == 4
    assert not launch_table(64, 64, 2, torch.bfloat16, False).output_transposed
    assert launch_table(64, 64, 3, torch.bfloat16, False).output_transposed
    assert not launch_table(64, 64, 5, torch.bfloat16, True).wy_series
    assert not launch_table(48, 64, 2, torch.bfloat16, True).state_fwd_lean
    assert not launch_table(64, 48, 2, torch.bfloat16, True).state_bwd_lean
    # the 340M flavors' value heads: the transform and the output kernels take all 256 columns in one tile
    wide = launch_table(128, 256, 2, torch.bfloat16, True)
    assert wide.wy_block_v == wide.output_block_v == 256
    assert wide.state_fwd_block_v == wide.state_bwd_block_v == 32
    assert launch_table(128, 256, 5, torch.bfloat16, True).wy_block_v == 64  # the substitution kernel loops V


def test_state_tiles_follow_the_program_count():
    """At K = 128, n_h = 2, 16-bit: 16-column state tiles where 32-column ones give fewer than 64 programs
    (340M at 32768 × 1: 4 heads × 8 tiles), 64-column ones (forward pass on 2 stages) from 512 programs
    (340M at batch 16); 32 in between and where the call's size is unknown."""
    def state_tiles(K=128, V=256, n_h=2, dtype=torch.bfloat16, sequence_heads=None):
        cfg = launch_table(K, V, n_h, dtype, True, sequence_heads)
        return cfg.state_fwd_block_v, cfg.state_bwd_block_v

    assert state_tiles(sequence_heads=4) == (16, 16)  # 32 programs at 32 columns
    assert state_tiles(sequence_heads=7) == (16, 16)  # 56
    assert state_tiles(sequence_heads=8) == state_tiles(sequence_heads=63) == state_tiles() == (32, 32)
    assert state_tiles(sequence_heads=64) == state_tiles(sequence_heads=1000) == (64, 64)  # 512 and up
    assert state_tiles(V=128, sequence_heads=15) == (16, 16)
    assert state_tiles(V=128, sequence_heads=16) == state_tiles(V=128, sequence_heads=127) == (32, 32)
    assert state_tiles(V=128, sequence_heads=128) == (64, 64)
    assert state_tiles(V=96, sequence_heads=1000) == (32, 32)  # not a multiple of 64 columns
    assert state_tiles(K=64, sequence_heads=1) == state_tiles(K=64, sequence_heads=1000) == (64, 32)
    assert state_tiles(n_h=1, sequence_heads=1) == state_tiles(n_h=1, sequence_heads=1000) == (32, 64)
    assert state_tiles(n_h=3, sequence_heads=1) == state_tiles(n_h=3, sequence_heads=1000) == (32, 32)
    assert state_tiles(V=72, sequence_heads=1) == (32, 32)  # not lean at 16 columns
    assert state_tiles(dtype=torch.float32, sequence_heads=1) == (16, 16)  # fp32's own rows
    assert state_tiles(dtype=torch.float32, sequence_heads=1000) == (16, 16)
    wide, default = (launch_table(128, 256, 2, torch.bfloat16, True, n) for n in (64, 8))
    assert (wide.state_fwd_stages, default.state_fwd_stages) == (2, 3)
    assert wide.state_fwd_lean and wide.state_bwd_lean


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("cu", [None, [0, 17, 45]])
def test_narrow_state_tiles_match_the_wide_ones(cu, monkeypatch):
    """Each value column of the state evolves on its own, so 16-, 32- and 64-column tiles give the same
    results (one sequence and head: the table picks 16; 32 and 64 forced). Not bitwise: the interpreter's
    products of different widths (numpy matmuls) may round an fp32 sum's last bit differently, and the fp16
    outputs and gradients then take the neighbouring fp16 value here and there (at most 2.4e-5 relative RMS
    over 40 seeds); a wrong column would be off by order one."""
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    inputs = make_inputs(1, 45, 1, 128, 64, 2, num_seqs=None if cu is None else 2, dtype=torch.float16)
    with launches() as log:
        narrow, _ = run_with(monkeypatch, inputs, 2, cu=cu)
    assert {kwargs["BV"] for name, kwargs in log if name.startswith("state_")} == {16}
    for columns, stages in ((32, 3), (64, 2)):
        tiles = dict(state_fwd_block_v=columns, state_bwd_block_v=columns, state_fwd_stages=stages)
        wide, _ = run_with(monkeypatch, inputs, 2, tiles, cu=cu)
        assert max_error(narrow, wide) < 2e-4


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("dtype", "n_h", "T", "gated"), [(torch.float32, 2, 45, True),
                                                          (torch.float16, 3, 50, False),
                                                          (torch.float16, 1, 70, True)])  # fmt: skip
def test_short_loop_forward_pass_is_bitwise_the_general_one(dtype, n_h, T, gated, monkeypatch):
    """Same products in the same dtypes, other addressing; odd T: a partial last chunk."""
    inputs = make_inputs(1, T, 2, 32, 32, n_h, gated=gated, dtype=dtype)
    lean, kernels = run_with(monkeypatch, inputs, n_h)
    general, general_kernels = run_with(monkeypatch, inputs, n_h, dict(state_fwd_lean=False))
    assert "state_fwd_lean_kernel" in kernels and "state_fwd_kernel" in general_kernels
    assert bitwise(lean, general)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("scale_by", [1.0, 1e-3, 30.0])
def test_fp16_state_products_within_fp16_rounding(scale_by, monkeypatch):
    """The forward pass's fp16 W·S (``state_fwd_s16``, K = 128 in the table) and the reverse pass's one fp16
    Wᵀ·dδ (short loop) against the general kernels' products, with power-of-two scales keeping the range."""
    inputs = make_inputs(1, 30, 1, 32, 32, 2, dtype=torch.float16)
    inputs["v"] = (inputs["v"].float() * scale_by).half()
    inputs["initial_state"] = inputs["initial_state"] * scale_by
    fast, _ = run_with(monkeypatch, inputs, 2, dict(state_fwd_s16=True))
    plain, kernels = run_with(monkeypatch, inputs, 2, dict(state_bwd_lean=False))
    assert "state_bwd_kernel" in kernels
    assert max_error(fast, plain) < 3e-3


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("dtype", "n_h", "K", "V", "cu"), [(torch.float32, 3, 32, 48, None),
                                                            (torch.float16, 1, 64, 64, [0, 9, 70]),
                                                            (torch.float16, 2, 16, 32, None)])  # fmt: skip
def test_hoisted_wy_bwd_is_bitwise_the_sliced_one(dtype, n_h, K, V, cu, monkeypatch):
    """The same products with the same operands in the same order; only the loads move. One slice and one V
    tile (the 16-bit rows' blocks; fp32's own rows slice narrower and never hoist)."""
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    T = 70 if cu is not None else 41
    inputs = make_inputs(1, T, 2, K, V, n_h, num_seqs=None if cu is None else cu.numel() - 1, dtype=dtype)
    one = dict(grad_block_k=triton.next_power_of_2(K), grad_block_v=triton.next_power_of_2(V))
    hoisted, kernels = run_with(monkeypatch, inputs, n_h, dict(one, wy_bwd_hoisted=True), cu=cu)
    sliced, sliced_kernels = run_with(monkeypatch, inputs, n_h, dict(one, wy_bwd_hoisted=False), cu=cu)
    assert "wy_bwd_hoisted_kernel" in kernels and "wy_bwd_sliced_kernel" in sliced_kernels
    assert bitwise(hoisted, sliced)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("dtype", "n_h", "gated", "tol"), [(torch.float32, 2, True, 1e-6),
                                                            (torch.float32, 3, False, 1e-6),
                                                            (torch.float16, 2, False, 3e-3)])  # fmt: skip
def test_transposed_output_matches_the_direct_one(dtype, n_h, gated, tol, monkeypatch):
    inputs = make_inputs(1, 45, 2, 32, 32, n_h, gated=gated, dtype=dtype)
    transposed, _ = run_with(monkeypatch, inputs, n_h, dict(output_transposed=True))
    direct, kernels = run_with(monkeypatch, inputs, n_h, dict(output_transposed=False))
    assert "output_fwd_kernel" in kernels
    assert max_error(transposed, direct) < tol


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "K"), [(3, 128), (2, 64)])
def test_gpu_short_loop_forward_pass_is_bitwise_the_general_one(n_h, K, monkeypatch):
    """Without the fp16 W·S the short loop changes addressing and order only (odd T: a partial chunk)."""
    inputs = make_inputs(2, 517, 4, K, K, n_h, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0.0))
    lean, _ = run_with(monkeypatch, inputs, n_h, dict(state_fwd_s16=False))
    general, _ = run_with(monkeypatch, inputs, n_h, dict(state_fwd_s16=False, state_fwd_lean=False,
                                                         state_fwd_stages=3 if K <= 64 else 2))  # fmt: skip
    assert bitwise(lean, general)


@pytest.mark.gpu
def test_gpu_state_tiles_of_every_width_give_the_same_results(monkeypatch):
    """The 340M op at batch 16 (the table's 64-column state tiles) against 32- and 16-column tiles forced:
    every value column evolves on its own through the same products (odd T: a partial chunk)."""
    inputs = make_inputs(16, 259, 4, 128, 256, 2, device="cuda", dtype=torch.bfloat16, gate_range=(-0.5, 0.0))
    with launches() as log:
        wide, _ = run_with(monkeypatch, inputs, 2)
    assert {kwargs["BV"] for name, kwargs in log if name.startswith("state_")} == {64}
    for columns in (32, 16):
        tiles = dict(state_fwd_block_v=columns, state_bwd_block_v=columns, state_fwd_stages=3)
        other, _ = run_with(monkeypatch, inputs, 2, tiles)
        assert bitwise(wide, other), columns


@pytest.mark.gpu
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_gpu_hoisted_wy_bwd_agrees_with_the_sliced_one(n_h, monkeypatch):
    """Where the compiled kernels sum in another order, bf16 outputs may flip their last bit: 1e-3 relative
    RMS allows that, not a wrong term."""
    cu = torch.tensor([0, 9, 1000], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 1000, 8, 64, 64, n_h, num_seqs=2, device="cuda", dtype=torch.bfloat16)
    hoisted, _ = run_with(monkeypatch, inputs, n_h, cu=cu)
    sliced, _ = run_with(monkeypatch, inputs, n_h, dict(wy_bwd_hoisted=False), cu=cu)
    assert max_error(hoisted, sliced) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize(("n_h", "T", "K", "gated"), [(2, 301, 64, False), (3, 177, 128, False),
                                                     (4, 99, 64, False), (2, 301, 64, True)])  # fmt: skip
def test_gpu_transposed_output_matches_the_direct_one(n_h, T, K, gated, monkeypatch):
    """Without the gate a first form of the transposed kernel chained its products the other way round and
    gave wrong o with 16-bit states."""
    inputs = make_inputs(2, T, 4, K, K, n_h, gated=gated, device="cuda", dtype=torch.bfloat16)
    transposed, _ = run_with(monkeypatch, inputs, n_h, dict(output_transposed=True))
    direct, _ = run_with(monkeypatch, inputs, n_h, dict(output_transposed=False))
    assert max_error(transposed, direct) < 1e-2
