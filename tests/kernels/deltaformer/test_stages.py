"""DeltaFormer stages on their own: the diagonal-block inverses, the path each width takes, the launch table.

CPU (CI): the separate inverse launch against ``torch.linalg.inv`` in fp64 (last partial chunk, packed
documents, both operand paths of the doubling); which solve each width runs; the GPU rows of the launch
table, the invariants the kernels rely on, and the fp32 GPU rows run in the interpreter against the fp64
oracle. GPU (``gpu`` marker): the inverse launch in bf16 against fp64.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.kernels.deltaformer.helpers import check_against_oracle
from titan_delta.testing import rel_rms_error
from titan_delta_kernels.deltaformer import config, passes
from titan_delta_kernels.deltaformer._common import LOG2_E, document_tables
from titan_delta_kernels.deltaformer.inverse import diag_inverse


def _expected_inverses(w, k, beta, lse, doc_start, scale: float, chunk: int) -> torch.Tensor:
    """(I + β P_cc)⁻¹ per chunk in fp64, P from the same stored normalisers the kernel reads."""
    B, T, H, _ = w.shape
    n_chunks = -(-T // chunk)
    out = torch.empty(B * H, n_chunks, chunk, chunk, dtype=torch.float64)
    for bh in range(B * H):
        b, h = divmod(bh, H)
        for c in range(n_chunks):
            rows = torch.arange(c * chunk, (c + 1) * chunk)
            ok = rows < T
            rows_in = rows.clamp_max(T - 1)
            s = (w[b, rows_in, h].double() @ k[b, rows_in, h].double().T) * scale * LOG2_E
            allowed = (rows[None, :] < rows[:, None]) & ok[:, None] & ok[None, :]
            if doc_start is not None:
                allowed &= rows[None, :] >= doc_start[rows_in].long()[:, None]
            p = torch.where(allowed, torch.exp2(s - lse[b, h, rows_in].double()[:, None]), 0.0)
            matrix = torch.eye(chunk, dtype=torch.float64) + beta[b, rows_in, h].double()[:, None] * p
            out[bh, c] = torch.linalg.inv(matrix)
    return out


def _strict_normalisers(w, k, doc_start, scale: float) -> torch.Tensor:
    """log2 Σ_{i<t, same document} 2^{s_ti} (0 for rows without keys): fp32 [B, H, T], as stored."""
    T = w.shape[1]
    s = torch.einsum("bthd,bihd->bhti", w.double(), k.double()) * scale * LOG2_E
    pos = torch.arange(T)
    allowed = pos[None, :] < pos[:, None]
    if doc_start is not None:
        allowed &= pos[None, :] >= doc_start.long()[:, None]
    lse = torch.logsumexp(torch.where(allowed, s / LOG2_E, float("-inf")), -1) * LOG2_E
    return torch.where(allowed.any(-1), lse, 0.0).float()


def _unscaled(inverses: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The stored inverses times their factors, fp64 on the CPU."""
    linv, scales = inverses
    return linv.cpu().double() * scales.cpu().double()[..., None, None]


@pytest.mark.parametrize("cu", [None, [0, 21, 22, 90, 100]])
def test_inverse_launch_matches_fp64(cu: list[int] | None) -> None:
    B, T, H, D, chunk = (1, 100, 2, 16, 64) if cu else (2, 100, 1, 16, 64)
    w, k = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    beta = torch.rand(B, T, H)
    doc_start = None if cu is None else document_tables(torch.tensor(cu, dtype=torch.int32), T)[0]
    lse = _strict_normalisers(w, k, doc_start, 0.3)
    got = _unscaled(diag_inverse(w, k, beta, lse, doc_start, scale=0.3, chunk=chunk, dot_prec="ieee",
                                 inv_prec="ieee"))
    want = _expected_inverses(w, k, beta, lse, doc_start, 0.3, chunk)
    last = T - (T - 1) // chunk * chunk  # rows of the last chunk inside the sequence
    assert rel_rms_error(got[:, :-1], want[:, :-1]) < 1e-6
    assert rel_rms_error(got[:, -1, :last, :last], want[:, -1, :last, :last]) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("probe", "beta_lo", "beta_hi", "tol"),
                         [("random", 0.0, 1.0, 2e-3), ("random", 1.5, 2.0, 2e-3),
                          ("previous", 1.0, 1.0, 1e-4), ("previous", 1.5, 1.5, 2e-2)])
def test_inverse_launch_tf32_operand_paths_match_fp64(probe: str, beta_lo: float, beta_hi: float,
                                                      tol: float, dtype: torch.dtype) -> None:
    """Under ``tf32`` the doubling takes fp16 operands where the rows of β·P sum to at most
    FP16_SAFE_ROW_SUM (β ≤ 1) and tf32 ones elsewhere. "previous": every row attends to the token before
    it alone, so with β = 1.5 the inverse holds (−1.5)^m and the squarings reach 1.5^32 > 65504, which fp16
    operands would turn into inf; with β = 1 its entries are ±1 (fp16 path, exact). 16-bit inputs store the
    inverses in fp16, there divided by a power of two (up to 1.5^63 / 2^15)."""
    torch.manual_seed(7)
    B, T, H, D, chunk = 1, 64, 1, 64, 64
    if probe == "random":
        w, k = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    else:  # one-hot keys; row t probes key t − 1 with a score of 40
        k = torch.eye(T)[None, :, None, :D].clone()
        w = 40.0 * torch.roll(k, 1, dims=1)
    w, k = w.to(dtype), k.to(dtype)
    beta = beta_lo + (beta_hi - beta_lo) * torch.rand(B, T, H)
    scale = 1.0 if probe == "previous" else 0.3
    lse = _strict_normalisers(w, k, None, scale)
    linv, scales = diag_inverse(w, k, beta, lse, None, scale=scale, chunk=chunk, dot_prec="ieee",
                                inv_prec="tf32")
    assert linv.dtype == (torch.float32 if dtype == torch.float32 else torch.float16)
    assert torch.isfinite(linv).all()
    if dtype == torch.float16:
        assert (linv.abs() <= 32768).all()
        assert (scales.max() > 1) == (probe == "previous" and beta_lo > 1)  # scaled where entries grow
    want = _expected_inverses(w, k, beta, lse, None, scale, chunk)
    assert rel_rms_error(_unscaled((linv, scales)), want) < tol


@pytest.mark.parametrize(("D", "Dv", "wave"),
                         [(16, 16, True), (64, 32, True), (16, 80, False), (72, 16, False)])
def test_width_picks_the_backward_solve(D: int, Dv: int, wave: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the inverse launch, width <= 64: wavefront launches that also form dk (no key pass), each
    superblock but the last after two key launches for the later rows (the interpreter's are 32 rows); wider:
    the superblock solve (a key launch for the later rows before each superblock but the last), then the
    key pass for dk."""
    called: list[str] = []
    for name in ("wave_backward", "solve_backward", "diag_inverse", "col_backward"):
        real = getattr(passes, name)
        monkeypatch.setattr(passes, name, lambda *a, _real=real, _name=name, **kw: called.append(_name)
                            or _real(*a, **kw))
    check_against_oracle(1, 40, 1, D, Dv, False, None)
    superblocks = ["solve_backward", "col_backward", "solve_backward", "col_backward"]
    wavefronts = ["wave_backward", "col_backward", "col_backward", "wave_backward"]
    assert called == ["diag_inverse"] + (wavefronts if wave else superblocks)


def test_launch_table_gpu_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU rows (docs/kernels_deltaformer.md, "Launch table")."""
    monkeypatch.setattr(config, "interpreting", lambda: False)
    small = config.launch_config(64, 64, 2048)
    assert (small.chunk, small.superblock, small.wave_backward) == (64, 512, True)
    assert small.wave_backward_superblock == 0  # one backward wavefront launch at T = 2048
    assert config.launch_config(64, 64, 4095).wave_backward_superblock == 0
    assert config.launch_config(64, 64, 4096).wave_backward_superblock == 1024
    assert (small.tiles, small.prep, small.prep_registers) == ((64, 64, 4, 3), (64, 64, 4, 3), 128)
    assert (small.wave_forward_launch, small.wave_backward_launch) == ((4, 3), (4, 3))
    assert config.launch_config(32, 64, 8192).superblock == 512
    large = config.launch_config(128, 128, 8192)
    assert (large.superblock, large.backward_superblock, large.wave_backward) == (512, 256, False)
    assert (large.tiles, large.prep_registers, large.wave_forward_launch) == ((128, 64, 8, 3), 0, (8, 2))
    assert (large.solve_launch, large.value_block) == ((8, 2), 64)
    mid = config.launch_config(96, 96, 2048)
    assert (mid.superblock, mid.backward_superblock, mid.value_block) == (512, 512, 64)
    assert mid.tiles == large.tiles
    # fp32 inputs, every width: 16-row chunks and tiles, no pipelining, the wavefront backward
    fp32 = config.launch_config(128, 128, 8192, fp32=True)
    assert (fp32.chunk, fp32.superblock, fp32.backward_superblock, fp32.wave_backward) == (16, 512, 256, True)
    assert fp32.wave_backward_superblock == 0
    assert (fp32.tiles, fp32.prep, fp32.prep_registers) == ((16, 32, 4, 1), (16, 32, 8, 1), 0)
    assert (fp32.wave_forward_launch, fp32.wave_backward_launch) == ((8, 1), (8, 1))
    assert config.launch_config(64, 64, 2048, fp32=True) == dataclasses.replace(fp32, superblock=1024,
                                                                                 backward_superblock=512)
    assert config.launch_config(128, 32, 100).value_block == 32
    with pytest.raises(ValueError, match="<= 128"):
        config.launch_config(256, 64, 100)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@pytest.mark.parametrize("fp32", [False, True])
@pytest.mark.parametrize("cpu_interpreter", [False, True])
def test_launch_rows_hold_the_kernels_invariants(fp32: bool, cpu_interpreter: bool) -> None:
    """What the kernels assume of every row: superblocks of whole chunks and whole preparation key tiles (the
    unmasked loops), preparation row tiles of whole chunks (its inverses), power-of-two tiles of at least 16
    (``tl.dot``), a value slice no wider than the padded value width."""
    for width in range(16, config.MAX_HEAD_DIM + 1, 8):
        for dv in (16, width):
            for seq_len in (1, 100, 2048, 8192, 40000):
                cfg = config._config(width, dv, seq_len, fp32, cpu_interpreter)
                rows, keys, warps, stages = cfg.prep
                assert _power_of_two(cfg.chunk) and cfg.chunk >= 16, cfg
                assert cfg.superblock % cfg.chunk == 0 and cfg.backward_superblock % cfg.chunk == 0, cfg
                assert cfg.wave_backward_superblock % cfg.chunk == 0, cfg
                assert cfg.superblock % keys == 0 and rows % cfg.chunk == 0, cfg
                for size in (*cfg.tiles[:2], rows, keys, cfg.value_block):
                    assert _power_of_two(size) and size >= 16, cfg
                for n_warps, n_stages in (cfg.tiles[2:], (warps, stages), cfg.wave_forward_launch,
                                          cfg.wave_backward_launch, cfg.solve_launch):
                    assert n_warps in (1, 2, 4, 8) and n_stages >= 1, cfg
                assert cfg.value_block <= max(16, 1 << (dv - 1).bit_length()), cfg


FP32_GPU_CASES = {
    # name: (B, T, H, D, Dv, separate_w, cu_seqlens, superblock or None for the row's own)
    "ragged": (1, 37, 2, 16, 16, False, None, None),
    "varlen_w_is_q": (1, 41, 1, 16, 32, False, [0, 17, 18, 41], None),
    "wide_values_varlen": (1, 101, 1, 16, 80, False, [0, 1, 40, 40, 101], None),
    "wide_keys_sep_w": (1, 50, 1, 72, 16, True, None, None),
    # the row's launches with 64-row forward superblocks, so that 140 tokens cross two boundaries
    "three_superblocks": (1, 130, 2, 16, 16, False, None, 64),
    "three_superblocks_varlen_sep_w": (1, 140, 1, 16, 32, True, [0, 3, 70, 70, 71, 140], 64),
    "three_superblocks_wide": (1, 140, 1, 80, 16, False, [0, 50, 140], 64),
}


@pytest.mark.parametrize("case", list(FP32_GPU_CASES))
def test_fp32_gpu_rows_match_fp64_oracle(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fp32 GPU rows (not the interpreter's) run in the interpreter: chunks, tiles and the wavefront
    backward at every width as an H100 launches them, against the fp64 oracle."""
    *args, superblock = FP32_GPU_CASES[case]
    gpu_row = config._config

    def row(head_dim, value_dim, seq_len, fp32, cpu_interpreter):
        cfg = gpu_row(head_dim, value_dim, seq_len, fp32, False)
        if fp32 and superblock is not None:
            cfg = dataclasses.replace(cfg, superblock=superblock)
        return cfg

    monkeypatch.setattr(config, "_config", row)
    called: list[str] = []
    for name in ("wave_backward", "solve_backward"):
        real = getattr(passes, name)
        monkeypatch.setattr(passes, name, lambda *a, _real=real, _name=name, **kw: called.append(_name)
                            or _real(*a, **kw))
    check_against_oracle(*args)
    assert called == ["wave_backward"]  # the interpreter's row takes the superblock backward above 64 columns
    gpu = gpu_row(args[3], args[4], args[1], True, False)
    assert config.launch_config(args[3], args[4], args[1], fp32=True).prep == gpu.prep != (16, 16, 4, 1)


# ----------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize(("beta_lo", "beta_hi"), [(0.0, 1.0), (0.9, 1.0), (1.5, 2.0)])
def test_gpu_inverse_operand_paths_match_fp64(beta_lo: float, beta_hi: float) -> None:
    """The doubling's fp16-operand path (β ≤ 1) and its tf32 fallback (β up to 2) on the GPU against
    ``torch.linalg.inv`` in fp64, chunk 64, from the same stored normalisers."""
    torch.manual_seed(3)
    B, T, H, D = 1, 512, 4, 64
    w, k = (torch.randn(B, T, H, D, dtype=torch.bfloat16) for _ in range(2))
    beta = (beta_lo + (beta_hi - beta_lo) * torch.rand(B, T, H)).to(torch.bfloat16)
    lse = _strict_normalisers(w, k, None, D**-0.5)
    got = _unscaled(diag_inverse(w.cuda(), k.cuda(), beta.cuda(), lse.cuda(), None, scale=D**-0.5, chunk=64,
                                 dot_prec="tf32", inv_prec="tf32"))
    want = _expected_inverses(w, k, beta, lse, None, D**-0.5, 64)
    err = rel_rms_error(got.double(), want)
    print(f"inverse, beta in ({beta_lo}, {beta_hi}): rel RMS error {err:.2e}")
    assert torch.isfinite(got).all() and err < 2e-3
