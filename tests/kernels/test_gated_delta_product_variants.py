"""Variants of the Triton Gated DeltaProduct kernels (``save_states``: on by default; ``lowp``) vs fp64.

``save_states`` must give bitwise the results of the ``plain`` path (it only skips a deterministic
recomputation); ``lowp`` stores intermediates in the input dtype, so on the CPU interpreter it is checked
in fp16 (the interpreter's bf16 arithmetic is not faithful; in fp32 it would change nothing). Allocations
are NaN-poisoned in one test so that any element read before it is written shows up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch

from titan_delta.testing import assert_rel_close, poison_
from titan_delta_kernels.gated_delta_product import api, chunk, gated_delta_product_triton
from titan_delta_kernels.gated_delta_product.chunk import gdp_chunk_fwd

from .test_gated_delta_product_triton import (
    NAMES,
    check_against_reference,
    make_inputs,
    random_cu_seqlens,
    run_with_grads,
)

# fp16 on the interpreter: the default path lands at 3–5e-4 relative RMS against fp64, lowp at 3–6e-4.
FP16_TOL = (1.5e-3, 2e-3, 2e-3)


def variant_kernel(variant: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """``gated_delta_product_triton`` with the named variant switched on explicitly."""
    on = api.parse_variant(variant)

    def run(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        return gated_delta_product_triton(
            *args, save_states="save_states" in on, lowp="lowp" in on, **kwargs
        )

    return run


def check_variant(variant: str, inputs: dict, n_h: int, cu_seqlens: torch.Tensor | None,
                  tols: tuple[float, float, float]) -> None:  # fmt: skip
    check_against_reference(inputs, n_h, cu_seqlens, *tols, kernel=variant_kernel(variant))


@contextlib.contextmanager
def poisoned_allocations(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside the block, floating tensors from torch.empty / empty_like / Tensor.new_empty come NaN-filled."""
    real = (torch.empty, torch.empty_like, torch.Tensor.new_empty)

    def poisoned(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def alloc(*args, **kwargs) -> torch.Tensor:
            t = fn(*args, **kwargs)
            return poison_(t) if t.is_floating_point() else t

        return alloc

    with monkeypatch.context() as patch:
        patch.setattr(torch, "empty", poisoned(real[0]))
        patch.setattr(torch, "empty_like", poisoned(real[1]))
        patch.setattr(torch.Tensor, "new_empty", poisoned(real[2]))
        yield


def check_poisoned(kernel: Callable, inputs: dict, n_h: int, cu_seqlens: torch.Tensor | None,
                   tols: tuple[float, float, float], monkeypatch: pytest.MonkeyPatch) -> None:
    """``check_against_reference`` with every allocation of both custom ops NaN-poisoned (the backward runs
    outside the forward's block, so its Python body is wrapped too)."""

    def poisoned_kernel(*args, **kwargs):
        with poisoned_allocations(monkeypatch):
            return kernel(*args, **kwargs)

    real_bwd = chunk.gdp_chunk_bwd

    def poisoned_bwd(*args, **kwargs):
        with poisoned_allocations(monkeypatch):
            return real_bwd(*args, **kwargs)

    monkeypatch.setattr(chunk, "gdp_chunk_bwd", poisoned_bwd)
    check_against_reference(inputs, n_h, cu_seqlens, *tols, kernel=poisoned_kernel)


@pytest.mark.parametrize(("n_h", "T", "gated"), [(1, 21, True), (2, 19, True), (3, 23, True), (3, 9, False)])
def test_save_states_matches_reference(n_h, T, gated):
    inputs = make_inputs(2, T, 2, 16, 32, n_h, gated=gated)
    check_variant("save_states", inputs, n_h, None, (1e-5, 1e-5, 1e-5))


@pytest.mark.parametrize(("variant", "n_h", "T"), [("lowp", 1, 21), ("lowp", 2, 19), ("lowp", 3, 23),
                                                   ("save_states+lowp", 2, 17)])  # fmt: skip
def test_lowp_fp16_matches_reference(variant, n_h, T):
    inputs = make_inputs(2, T, 2, 16, 32, n_h, dtype=torch.float16)
    check_variant(variant, inputs, n_h, None, FP16_TOL)


@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_variants_varlen_match_reference(n_h):
    """Documents of random lengths (one may be empty), with initial and final states."""
    cu = random_cu_seqlens(24, 4)
    inputs = make_inputs(1, 24, 2, 16, 16, n_h, num_seqs=4, dtype=torch.float16)
    check_variant("save_states+lowp", inputs, n_h, cu, FP16_TOL)


def count_state_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patches the forward state pass used by the custom ops; the returned list grows by one per call."""
    calls: list[int] = []
    real_state_fwd = chunk.state_fwd

    def counting_state_fwd(*args, **kwargs):
        calls.append(1)
        return real_state_fwd(*args, **kwargs)

    monkeypatch.setattr(chunk, "state_fwd", counting_state_fwd)
    return calls


def test_save_states_is_bitwise_the_default_and_skips_the_state_pass(monkeypatch):
    """Same kernels, same order: saving the states must not change a bit, only drop the recomputation."""
    calls = count_state_passes(monkeypatch)
    cu = torch.tensor([0, 5, 5, 40], dtype=torch.int32)
    inputs = make_inputs(1, 40, 2, 16, 16, 2, num_seqs=3)
    d_out = torch.randn(1, 40, 2, 16, dtype=torch.float64)
    d_final = torch.randn(3, 2, 16, 16, dtype=torch.float64)
    results = {}
    for variant in ("plain", "save_states"):
        calls.clear()
        results[variant] = run_with_grads(variant_kernel(variant), inputs, 2, cu, d_out, d_final)
        assert len(calls) == (2 if variant == "plain" else 1), (variant, len(calls))
    (o0, f0, g0), (o1, f1, g1) = results["plain"], results["save_states"]
    assert torch.equal(o0, o1) and torch.equal(f0, f1)
    for name in g0:
        assert torch.equal(g0[name], g1[name]), f"d{name} differs"


def test_environment_switch_reaches_the_public_op(monkeypatch):
    """``$TITAN_DELTA_GDP_VARIANT`` is read per call, so it also applies through ``titan_delta.ops``."""
    from titan_delta.ops import gated_delta_product

    monkeypatch.delenv(api.VARIANT_ENV, raising=False)
    assert api.resolve_variant(None, None) == (True, False)  # the default: save_states
    monkeypatch.setenv(api.VARIANT_ENV, "plain")
    assert api.resolve_variant(None, None) == (False, False)
    monkeypatch.setenv(api.VARIANT_ENV, "save_states+lowp")
    assert api.resolve_variant(None, None) == (True, True)
    assert api.resolve_variant(False, None) == (False, True)
    monkeypatch.setenv(api.VARIANT_ENV, "lowp,fast")
    with pytest.raises(ValueError, match="fast"):
        api.resolve_variant(None, None)
    monkeypatch.setenv(api.VARIANT_ENV, "save_states")
    calls = count_state_passes(monkeypatch)
    inputs = make_inputs(1, 10, 1, 16, 16, 3)
    leaves = [inputs[n].requires_grad_() for n in NAMES[:5]]
    o, _ = gated_delta_product(*leaves, num_householder=3, backend="triton")
    o.square().sum().backward()
    assert len(calls) == 1  # the backward used the saved states


def test_poisoned_allocations_are_fully_overwritten(monkeypatch):
    """Every buffer the kernels allocate starts as NaN: outputs, saved states, W/U/δ in fp16, gradients."""
    cu = torch.tensor([0, 1, 17, 17, 29], dtype=torch.int32)
    inputs = make_inputs(1, 29, 2, 16, 16, 3, num_seqs=4, dtype=torch.float16)
    check_poisoned(variant_kernel("save_states+lowp"), inputs, 3, cu, FP16_TOL, monkeypatch)


def test_variant_fake_shapes_and_compile():
    """Fake outputs match the real ones (fp16 W/U/δ with lowp) and fullgraph compile + backward agree."""
    inputs = make_inputs(1, 10, 2, 16, 32, 3, num_seqs=2, dtype=torch.float16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    args = (*(inputs[n] for n in NAMES), cu, 3, 0.5, True, True)
    torch.library.opcheck(gdp_chunk_fwd, args, test_utils=("test_schema", "test_faketensor"))
    out = gdp_chunk_fwd(*args)
    assert [t.dtype for t in out[3:7]] == [torch.float16] * 4

    def block(q, k, v, g, beta, h0):
        o, final = gated_delta_product_triton(
            q, k, v, g, beta, num_householder=3, initial_state=h0, output_final_state=True, cu_seqlens=cu,
            save_states=True, lowp=True,
        )  # fmt: skip
        return o.float().square().sum() + final.sum()

    leaves = [inputs[n].detach().requires_grad_() for n in NAMES]
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    grads = torch.autograd.grad(compiled(*leaves), leaves)
    expected = torch.autograd.grad(block(*leaves), leaves)
    for name, a, b in zip(NAMES, grads, expected, strict=True):
        assert_rel_close(a, b, 1e-6, f"compiled d{name}")


# ---------------------------------------------------------------- GPU tests (real shapes, bf16)
# Few on purpose: every new (n_h, K, dtype, varlen) combination costs ~8 kernel compiles in the proof run.
@pytest.mark.gpu
def test_gpu_lowp_bf16_matches_reference():
    """The issue's tolerances at K = V = 128, n_h = 2 (the benchmark's main shape)."""
    inputs = make_inputs(2, 257, 4, 128, 128, 2, device="cuda", dtype=torch.bfloat16,
                         gate_range=(-0.5, 0.0))  # fmt: skip
    inputs["beta"] = inputs["beta"].to(torch.bfloat16)
    check_variant("lowp", inputs, 2, None, (5e-3, 1e-2, 2e-2))


@pytest.mark.gpu
def test_gpu_save_states_lowp_varlen_matches_reference():
    cu = torch.tensor([0, 63, 64, 300, 301, 555], dtype=torch.int32, device="cuda")
    inputs = make_inputs(1, 555, 4, 128, 128, 3, num_seqs=5, device="cuda", dtype=torch.bfloat16)
    check_variant("save_states+lowp", inputs, 3, cu, (5e-3, 1e-2, 2e-2))


@pytest.mark.gpu
def test_gpu_save_states_is_bitwise_the_default():
    """Same compiled kernels as the default n_h = 2, K = 64 GPU test; only the recomputation is dropped."""
    inputs = make_inputs(2, 201, 4, 64, 64, 2, device="cuda", dtype=torch.bfloat16)
    d_out = torch.randn(2, 201, 4, 64, device="cuda", dtype=torch.float64)
    d_final = torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.float64)
    a = run_with_grads(variant_kernel("plain"), inputs, 2, None, d_out, d_final)
    b = run_with_grads(variant_kernel("save_states"), inputs, 2, None, d_out, d_final)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for name in a[2]:
        assert torch.equal(a[2][name], b[2][name]), f"d{name} differs"
