"""Opt-in DeltaFormer kernel variants (``variant=`` / ``TITAN_DELTA_DF_VARIANT``) against the references.

CPU (CI): Triton's interpreter at tiny shapes (chunk 16, superblock 32 unless the variant changes them)
against the fp64 token-by-token oracle: odd T, varlen with empty and one-token documents, T = 1, a
separate probe w, bf16 inputs. GPU (``gpu`` marker): bf16 at real shapes against the fp32 chunk-wise
reference, the same bounds as the default kernels. Kernel-allocated buffers are NaN-poisoned.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_deltaformer_triton import (
    _gpu_check,
    _grads,
    _make,
    check_against_oracle,
    check_variant_on_gpu,
)
from titan_delta.ops.deltaformer.reference import deltaformer_attn_recurrent
from titan_delta.testing import rel_rms_error
from titan_delta_kernels.deltaformer import deltaformer_attn_triton
from titan_delta_kernels.deltaformer._common import BlockConfig, apply_variant


@pytest.fixture(autouse=True)
def poisoned_buffers_default_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN-filled kernel buffers and no variant from the environment; also used (imported) by the wavefront
    and split-inverse test files."""
    monkeypatch.setenv("TITAN_DELTA_POISON", "1")
    monkeypatch.delenv("TITAN_DELTA_DF_VARIANT", raising=False)


CPU_CASES = {
    # name: (variant, B, T, H, D, Dv, separate_w, cu_seqlens)
    "fused_ragged": ("fused", 1, 37, 2, 16, 16, False, None),
    "fused_varlen_sep_w": ("fused", 1, 45, 2, 16, 16, True, [0, 1, 20, 20, 45]),
    "fused_keepinv_vsplit_varlen": ("fused,keepinv,vsplit=2", 1, 41, 1, 16, 32, False, [0, 17, 18, 41]),
    "fused_two_chunk_tiles": ("fused,keepinv,ptile=32:16:4:1", 2, 40, 1, 16, 32, True, None),
    "fused_wide_tiles_varlen": ("fused,ptile=32:32:4:1,sb=64", 1, 71, 1, 16, 16, False, [0, 5, 38, 71]),
    "fused_single_token": ("fused,keepinv", 1, 1, 1, 16, 16, False, None),
    "keepinv_wide_solve_tiles": ("keepinv,skeys=32", 1, 45, 1, 16, 16, False, [0, 1, 20, 20, 45]),
    "chunk32_all": ("fused,keepinv,chunk=32,sb=64,skeys=64,swarps=8", 1, 75, 1, 16, 16, False, [0, 33, 75]),
    "overlap_varlen": ("overlap,keepinv", 1, 101, 1, 16, 16, False, [0, 3, 50, 50, 101]),
    "overlap_sep_w_two_chunk_tiles": ("overlap,ptile=32:16:4:1", 2, 83, 1, 16, 32, True, None),
    # the separate-launch path (the default before run 4, and still above D = 128)
    "unfused_ragged": ("unfused", 1, 37, 2, 16, 16, False, None),
    "unfused_varlen_sep_w": ("unfused", 1, 45, 2, 16, 16, True, [0, 1, 20, 20, 45]),
    "unfused_keepinv_vsplit_varlen": ("unfused,keepinv,vsplit=2", 1, 41, 1, 16, 32, False, [0, 17, 18, 41]),
    "unfused_overlap_is_off": ("overlap,unfused", 1, 70, 1, 16, 16, False, [0, 33, 70]),
}


@pytest.mark.parametrize("case", list(CPU_CASES))
def test_variant_matches_fp64_oracle(case: str) -> None:
    variant, *shape = CPU_CASES[case]
    check_against_oracle(*shape, variant=variant)


def test_fused_keepinv_never_rebuilds_inverses(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``fused,keepinv`` and w = q, neither pass may launch the separate inverse kernel, nor the
    forward its normaliser or contribution passes (the row-kernel forward)."""
    from titan_delta_kernels.deltaformer import passes

    def forbidden(*_args, **_kwargs):
        raise AssertionError("a pass that the fused variant replaces ran")

    monkeypatch.setattr(passes, "_inverses", forbidden)
    monkeypatch.setattr(passes, "row_forward", forbidden)
    check_against_oracle(1, 33, 1, 16, 16, False, None, variant="fused,keepinv")


def test_variant_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench selects variants through TITAN_DELTA_DF_VARIANT; the keyword wins over it."""
    monkeypatch.setenv("TITAN_DELTA_DF_VARIANT", "fused,keepinv,skeys=32")
    check_against_oracle(1, 35, 1, 16, 16, False, [0, 12, 35], variant="")
    monkeypatch.setenv("TITAN_DELTA_DF_VARIANT", "no-such-variant")
    check_against_oracle(1, 9, 1, 16, 16, False, None, variant="fused")


def test_bf16_inputs_with_variant_close_to_oracle() -> None:
    q, k, v, beta, _ = _make(1, 29, 1, 16, 16, separate_w=False, dtype=torch.bfloat16, device="cpu")
    ours = deltaformer_attn_triton(q, k, v, beta, scale=0.25, variant="fused,keepinv")
    ref = deltaformer_attn_recurrent(*(x.double() for x in (q, k, v, beta)), scale=0.25)
    assert ours.dtype == torch.bfloat16
    assert rel_rms_error(ours, ref) <= 1e-2


def test_apply_variant_parses_and_rejects() -> None:
    base = BlockConfig(chunk=64, superblock=512, value_split=2, num_warps=8, num_stages=2,
                       row_tiles=(128, 64, 8, 3), col_tiles=(128, 64, 8, 3))
    assert apply_variant(base, "") == base
    cfg = apply_variant(base, " fused , keepinv,skeys=128,swarps=4,chunk=32,sb=100,ptile=64:64:4:3")
    assert (cfg.fused_prep, cfg.keep_inverse, cfg.solve_tile, cfg.num_warps) == (True, True, 128, 4)
    assert (cfg.chunk, cfg.superblock, cfg.prep) == (32, 96, (64, 64, 4, 3))
    assert apply_variant(base, "fused").prep == (128, 64, 8, 3)  # the row kernels' tiles by default
    assert (apply_variant(base, "overlap").fused_prep, apply_variant(base, "fused").overlap) == (True, False)
    assert apply_variant(base, "chunk=128,sb=100").superblock == 128  # at least one chunk per superblock
    assert apply_variant(base, "vsplit=4").value_split == 4
    unfused = apply_variant(base, "overlap,unfused")
    assert (unfused.fused_prep, unfused.overlap) == (False, False)
    tiled = apply_variant(BlockConfig(chunk=64, superblock=512, value_split=1, num_warps=4, num_stages=2,
                                      prep_tiles=(64, 64, 4, 3)), "chunk=128")
    assert tiled.prep == (128, 64, 4, 3)  # fused rows follow a chunk larger than the default tiles
    for bad in ("fuse", "skeys=48", "chunk=8", "ptile=48:64:4:3", "ptile=64:64", "sb=", "keepinv=1",
                "vsplit=0"):
        with pytest.raises(ValueError):
            apply_variant(base, bad)


def test_value_slices_under_64_columns_are_refused_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """32-wide value slices hit illegal memory accesses on an H200 (Triton 3.6); outside the interpreter
    the launcher refuses slices under 64 columns by name instead of corrupting the CUDA context."""
    from titan_delta_kernels.deltaformer import solve

    monkeypatch.setattr(solve, "interpreting", lambda: False)
    assert solve._value_slice(128, 128, 2, 8) == 64
    assert solve._value_slice(64, 64, 1, 4) == 64
    assert solve._value_slice(64, 32, 1, 4) == 32  # a narrow DV is not a slice
    for D, DV, split, warps in ((128, 128, 4, 8), (128, 128, 4, 4), (64, 64, 2, 4)):
        with pytest.raises(ValueError, match=f"value_split={split}"):
            solve._value_slice(D, DV, split, warps)
    monkeypatch.setattr(solve, "interpreting", lambda: True)
    assert solve._value_slice(64, 64, 4, 8) == 16  # the interpreter checks the slicing arithmetic


def check_opcheck_and_compile(T: int, opcheck_variant: str, compile_variant: str) -> None:
    """``opcheck`` of the forward op with ``opcheck_variant`` (its fake kernel must agree with the real one,
    kept-inverse output included), then an ``aot_eager`` fullgraph compile of a block with
    ``compile_variant`` against eager."""
    from titan_delta_kernels.deltaformer.op import _fwd

    q, k, v, beta, _ = _make(1, T, 1, 16, 16, separate_w=False, dtype=torch.float32, device="cpu")
    leaves = tuple(x.clone().requires_grad_(True) for x in (q, k, v, beta))
    torch.library.opcheck(_fwd, (*leaves, None, None, 0.25, opcheck_variant))

    def block(q, k, v, beta):
        return deltaformer_attn_triton(q, k, torch.tanh(v), beta, scale=0.25, variant=compile_variant)

    d_out = torch.randn(1, T, 1, 16)
    eager, eager_grads = _grads(block, [q, k, v, beta], d_out)
    out, grads = _grads(torch.compile(block, fullgraph=True, backend="aot_eager"), [q, k, v, beta], d_out)
    assert rel_rms_error(out, eager) <= 1e-6
    assert all(rel_rms_error(a, b) <= 1e-6 for a, b in zip(grads, eager_grads, strict=True))


def test_variant_compiles_fullgraph_and_passes_opcheck() -> None:
    """The kept-inverse output changes the op's outputs: its fake kernel must agree with the real one."""
    check_opcheck_and_compile(18, "fused,keepinv", "fused,keepinv")


# ----------------------------------------------------------------------------------------------- GPU

GPU_VARIANTS = ["keepinv", "unfused", "overlap,keepinv,chunk=32,skeys=64,sb=256"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", GPU_VARIANTS)
@pytest.mark.parametrize(("B", "T", "H", "D"), [(2, 1000, 4, 64), (1, 777, 3, 128)])
def test_gpu_variant_matches_fp32_reference(variant: str, B, T, H, D, monkeypatch) -> None:
    check_variant_on_gpu(variant, B, T, H, D, monkeypatch)


@pytest.mark.gpu
def test_gpu_variant_varlen_separate_w(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITAN_DELTA_DF_VARIANT", "overlap,keepinv,skeys=128,sb=256")
    errors = _gpu_check(1, 3000, 2, 64, separate_w=True, dtype=torch.bfloat16,
                        cu=[0, 1, 700, 700, 1777, 2900, 3000])
    print("varlen bf16 overlap,keepinv,skeys=128,sb=256: "
          + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))


@pytest.mark.gpu
def test_gpu_overlap_variant_does_not_synchronise_with_host() -> None:
    """The side stream is joined with events only: no host synchronisation, varlen included."""
    q, k, v, beta, _ = _make(1, 1024, 2, 64, 64, separate_w=False, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, 300, 1024], dtype=torch.int32, device="cuda")
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    variant = "overlap,keepinv,sb=128"
    deltaformer_attn_triton(*leaves, scale=0.125, cu_seqlens=cu, variant=variant).sum().backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        deltaformer_attn_triton(*leaves, scale=0.125, cu_seqlens=cu, variant=variant).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_overlap_stream_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The side-stream order of ``overlap``, with CUDA streams and events stood in for on the CPU: each
    partial launch waits for the solve of the superblock before the current one, and the main stream
    waits for it before the finishing launch; the result still matches the oracle."""
    import contextlib

    from titan_delta_kernels.deltaformer import passes

    log: list[tuple] = []
    current = ["main"]

    class Event:
        made = 0

        def __init__(self) -> None:
            Event.made += 1
            self.id = Event.made

        def record(self, stream) -> None:
            log.append(("record", stream.name, self.id))

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_event(self, event: Event) -> None:
            log.append(("wait", self.name, event.id))

    @contextlib.contextmanager
    def on(stream: Stream):
        current.append(stream.name)
        yield
        current.pop()

    def logged(name, fn):
        def run(*args, **kwargs):
            log.append((name, current[-1], kwargs["row_lo"], kwargs.get("finish", True)))
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(current[-1]))
    monkeypatch.setattr(passes, "_side_stream", lambda device: Stream("side"))
    monkeypatch.setattr(passes, "prep_superblock", logged("prep", passes.prep_superblock))
    monkeypatch.setattr(passes, "solve_forward", logged("solve", passes.solve_forward))
    q, k, v, beta, _ = _make(1, 101, 1, 16, 16, separate_w=False, dtype=torch.float64, device="cpu")
    with torch.no_grad():
        ours = deltaformer_attn_triton(*(x.float() for x in (q, k, v, beta)), scale=0.4, variant="overlap")
    assert rel_rms_error(ours, deltaformer_attn_recurrent(q, k, v, beta, scale=0.4)) <= 2e-5
    assert log == [
        ("prep", "main", 0, True), ("solve", "main", 0, True), ("record", "main", 1),
        ("prep", "main", 32, True), ("solve", "main", 32, True), ("record", "main", 2),
        ("wait", "side", 1), ("prep", "side", 64, False), ("record", "side", 3), ("wait", "main", 3),
        ("prep", "main", 64, True), ("solve", "main", 64, True), ("record", "main", 4),
        ("wait", "side", 2), ("prep", "side", 96, False), ("record", "side", 5), ("wait", "main", 5),
        ("prep", "main", 96, True), ("solve", "main", 96, True), ("record", "main", 6),
    ]
