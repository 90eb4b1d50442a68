"""The ``wave`` variant: each stage-1 solve as one wavefront launch (``kernels/deltaformer/wavefront.py``).

CPU (CI): Triton's interpreter against the fp64 oracle, at lengths long enough that programs take the
main (already solved) key loop as well as the DEFER chunks they wait for one by one; varlen with empty and
one-token documents, separate probe, kept inverses, several (b, h) sharing the ticket counter. GPU
(``gpu`` marker): bf16 at real shapes against the fp32 reference, bitwise repeatability (a missed wait
would show up as run-to-run differences), no host synchronisation, and agreement with the superblock path
on a grid with far more programs than fit on the GPU at once.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_deltaformer_triton import (
    _gpu_check,
    _make,
    check_against_oracle,
    check_variant_on_gpu,
)
from tests.kernels.test_deltaformer_variants import (  # the autouse fixture applies here too
    check_opcheck_and_compile,
    poisoned_buffers_default_variant,  # noqa: F401
)
from titan_delta.testing import rel_rms_error
from titan_delta_kernels.deltaformer import _common, deltaformer_attn_triton, prep, superblock_wave
from titan_delta_kernels.deltaformer._common import BlockConfig, apply_variant

CPU_CASES = {
    # name: (variant, B, T, H, D, Dv, separate_w, cu_seqlens); interpreter chunks are 16 rows
    "long_two_heads": ("wave", 2, 100, 2, 16, 16, False, None),
    "varlen_sep_w_defer1": ("wave,defer=1", 1, 101, 1, 16, 16, True, [0, 3, 50, 50, 101]),
    "varlen_keepinv_chunk32": ("wave,keepinv,defer=3,chunk=32", 1, 90, 1, 16, 32, False, [0, 33, 34, 90]),
    "one_token_documents": ("wave", 1, 70, 1, 16, 16, False, [0, 1, 2, 40, 41, 70]),
    "wide_values_sep_w": ("wave,keepinv", 1, 67, 2, 16, 32, True, None),
    "single_token": ("wave", 1, 1, 1, 16, 16, False, None),
    # the wavefront inside each superblock (interpreter superblocks: 32 rows = 2 chunks unless widened)
    "sb_long_two_heads": ("wavesb,wavebwd,sb=64", 2, 100, 2, 16, 16, False, None),
    "sb_varlen_sep_w_defer1": ("wavesb,sb=64,defer=1", 1, 101, 1, 16, 16, True, [0, 3, 50, 50, 101]),
    "sb_varlen_keepinv_unfused": ("wavesb,unfused,keepinv,sb=80", 1, 90, 1, 16, 32, False, [0, 33, 34, 90]),
    "sb_single_token": ("wavesb", 1, 1, 1, 16, 16, False, None),
    "backward_only_varlen": ("wavebwd,sb=64", 1, 75, 2, 16, 16, False, [0, 20, 21, 75]),
    # forward superblocks twice the backward's (the GPU defaults since run 14)
    "sb_longer_than_backward": ("wavesb,sb=64,bsb=32", 1, 100, 2, 16, 16, False, [0, 45, 100]),
    # the superblock wavefront's programs build their chunks' inverses (the preparation launch skips them)
    "waveinv_varlen_keepinv": ("waveinv,sb=64,keepinv", 1, 101, 1, 16, 16, False, [0, 3, 50, 50, 101]),
    "waveinv_ragged_sep_w": ("waveinv,wavebwd,sb=48", 2, 77, 1, 16, 32, True, None),
    "waveinv_split_inverse": ("waveinv,chunk=32,sb=64,invsplit=2", 1, 70, 2, 16, 16, False, [0, 20, 70]),
}


@pytest.mark.parametrize("case", list(CPU_CASES))
def test_wave_matches_fp64_oracle(case: str) -> None:
    variant, *shape = CPU_CASES[case]
    check_against_oracle(*shape, variant=variant)


def test_wave_launches_no_superblock_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``wave`` neither pass may fall back to the superblock launches or the separate inverses."""
    from titan_delta_kernels.deltaformer import passes

    def forbidden(*_args, **_kwargs):
        raise AssertionError("a launch that the wavefront replaces ran")

    for name in ("_inverses", "solve_forward", "solve_backward", "prep_superblock"):
        monkeypatch.setattr(passes, name, forbidden)
    check_against_oracle(1, 60, 1, 16, 16, False, None, variant="wave")


def test_wavesb_keeps_the_preparation_but_not_the_sequential_solves(monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_delta_kernels.deltaformer import passes

    def forbidden(*_args, **_kwargs):
        raise AssertionError("a sequential solve ran under wavesb,wavebwd")

    prepared = []
    real_prep = passes.prep_superblock
    monkeypatch.setattr(passes, "prep_superblock", lambda *a, **kw: prepared.append(1) or real_prep(*a, **kw))
    for name in ("_inverses", "solve_forward", "solve_backward"):
        monkeypatch.setattr(passes, name, forbidden)
    check_against_oracle(1, 60, 1, 16, 16, False, None, variant="wavesb,wavebwd")
    assert len(prepared) == 2  # 60 rows = two 32-row superblocks under the interpreter


def test_wave_tokens_parse_and_reject() -> None:
    base = BlockConfig(chunk=64, superblock=512, value_split=1, num_warps=4, num_stages=2)
    cfg = apply_variant(base, "wave,defer=3,wtile=8:3:4:1")
    assert (cfg.wave_forward, cfg.wave_backward) == ("full", True)
    assert (cfg.wave_defer, cfg.wave_tiles) == (3, (8, 3, 4, 1))
    assert (apply_variant(cfg, "superblocks").wave_forward, apply_variant(cfg, "superblocks").wave_backward) \
        == ("", False)
    assert (apply_variant(base, "wavesb").wave_forward, apply_variant(base, "wavesb").wave_backward) \
        == ("superblock", False)
    assert (apply_variant(base, "wavebwd").wave_forward, apply_variant(base, "wavebwd").wave_backward) \
        == ("", True)
    for bad in ("wave=1", "defer=0", "wtile=8:3", "wtile=6:2:4:2"):
        with pytest.raises(ValueError):
            apply_variant(base, bad)


def test_register_caps_parse_reject_and_reach_the_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    base = BlockConfig(chunk=64, superblock=512, value_split=1, num_warps=4, num_stages=2)
    cfg = apply_variant(base, "wavesb,fused,pregs=128,wregs=120")
    assert (cfg.prep_registers, cfg.wave_registers) == (128, 120)
    for bad in ("pregs=8", "wregs=256", "pregs"):
        with pytest.raises(ValueError):
            apply_variant(base, bad)
    monkeypatch.setattr(_common, "interpreting", lambda: False)
    assert _common.register_cap(128) == {"maxnreg": 128}
    assert _common.register_cap(0) == {}
    monkeypatch.undo()
    assert _common.register_cap(128) == {}  # the interpreter has no such option
    caps: list[tuple[str, int]] = []
    monkeypatch.setattr(prep, "register_cap", lambda regs: caps.append(("prep", regs)) or {})
    monkeypatch.setattr(superblock_wave, "register_cap", lambda regs: caps.append(("wave", regs)) or {})
    check_against_oracle(1, 60, 1, 16, 16, False, None, variant="wavesb,pregs=96,wregs=112")
    assert ("prep", 96) in caps and ("wave", 112) in caps


def test_wave_compiles_fullgraph_and_passes_opcheck() -> None:
    check_opcheck_and_compile(40, "wave,keepinv", "wave")


# ----------------------------------------------------------------------------------------------- GPU

GPU_WAVE_VARIANTS = ["wave", "wave,keepinv", "wave,defer=1", "wavesb,wavebwd,wtile=4:3:4:3", "wavesb,keepinv",
                     "waveinv,keepinv", "wavesb,pregs=128,wregs=128"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", GPU_WAVE_VARIANTS)
@pytest.mark.parametrize(("B", "T", "H", "D"), [(2, 1000, 4, 64), (1, 777, 3, 128), (1, 2048, 2, 128)])
def test_gpu_wave_matches_fp32_reference(variant: str, B, T, H, D, monkeypatch) -> None:
    check_variant_on_gpu(variant, B, T, H, D, monkeypatch)


@pytest.mark.gpu
def test_gpu_wave_varlen_separate_w(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITAN_DELTA_DF_VARIANT", "wave")
    errors = _gpu_check(1, 3000, 2, 64, separate_w=True, dtype=torch.bfloat16,
                        cu=[0, 1, 700, 700, 1777, 2900, 3000])
    print("varlen bf16 wave, separate w: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))


def _wave_run(B: int, T: int, H: int, D: int, variant: str, cu: torch.Tensor | None = None, seed: int = 0):
    torch.manual_seed(seed)
    q, k, v, beta, _ = _make(B, T, H, D, D, separate_w=False, dtype=torch.bfloat16, device="cuda")
    d_out = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    leaves = [x.requires_grad_(True) for x in (q, k, v, beta)]
    out = deltaformer_attn_triton(*leaves, scale=D**-0.5, cu_seqlens=cu, variant=variant)
    out.backward(d_out)
    return [out.detach()] + [x.grad for x in leaves]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["wave", "wavesb,wavebwd"])
@pytest.mark.parametrize(("B", "T", "H", "D"), [(8, 2048, 16, 64), (2, 4096, 16, 128)])
def test_gpu_wave_is_bitwise_repeatable_and_matches_superblocks(variant: str, B, T, H, D) -> None:
    """Thousands of programs, many more than are resident at once: every run gives the same bits (each
    program sums in a fixed order, so a read of rows before their flag was set would show as a
    difference), and the result agrees with the superblock schedule."""
    first = _wave_run(B, T, H, D, variant)
    for _ in range(2):
        again = _wave_run(B, T, H, D, variant)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    blocks = _wave_run(B, T, H, D, "superblocks")
    names = ("o", "dq", "dk", "dv", "dbeta")
    errors = {n: rel_rms_error(a.float(), b.float()) for n, a, b in zip(names, first, blocks, strict=True)}
    print(f"[{B},{T},{H},{D}] {variant} vs superblocks: "
          + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))
    assert all(e <= 1e-2 for e in errors.values())


@pytest.mark.gpu
def test_gpu_wave_does_not_synchronise_with_host() -> None:
    cu = torch.tensor([0, 300, 1024], dtype=torch.int32, device="cuda")
    _wave_run(1, 1024, 2, 64, "wave", cu)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _wave_run(1, 1024, 2, 64, "wave", cu)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_gpu_defaults_are_the_measured_wavefronts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU defaults (docs/benchmarks.md, runs 9-11): the superblock wavefront forward up to D = 128,
    the wavefront backward up to D = 64 only, the separate launches above D = 128."""
    from titan_delta_kernels.deltaformer import _common

    monkeypatch.setattr(_common, "interpreting", lambda: False)
    for name in ("TITAN_DELTA_DF_SUPERBLOCK", "TITAN_DELTA_DF_VSPLIT", "TITAN_DELTA_DF_TILES"):
        monkeypatch.delenv(name, raising=False)
    small = _common.default_config(64, 64, 2048)
    assert (small.wave_forward, small.wave_backward, small.wave_tiles) == ("superblock", True, (4, 3, 4, 3))
    assert (small.superblock, small.bwd_superblock) == (1024, 512)  # the forward's: fewer launches (run 14)
    large = _common.default_config(128, 128, 8192)
    assert (large.wave_forward, large.wave_backward) == ("superblock", False)
    assert (large.superblock, large.bwd_superblock) == (512, 256)
    wide = _common.default_config(256, 256, 2048)
    assert (wide.fused_prep, wide.wave_forward, wide.wave_backward) == (False, "", False)
    assert (wide.superblock, wide.bwd_superblock) == (512, 512)
    assert _common.apply_variant(large, "sb=128").bwd_superblock == 128  # sb=N sets both passes
    assert _common.apply_variant(large, "sb=1024,bsb=100").bwd_superblock == 64  # rounded down to chunks
    old = _common.default_config(64, 64, 2048, "superblocks")
    assert (old.wave_forward, old.wave_backward, old.fused_prep) == ("", False, True)
    assert (old.superblock, old.bwd_superblock) == (512, 512)
