"""DeltaFormer stages on their own: the diagonal-block inverses, the path each width takes, the launch table.

CPU (CI): the separate inverse launch against ``torch.linalg.inv`` in fp64 (last partial chunk, packed
documents, both operand paths of the doubling); which solve each width runs; the GPU rows of the launch
table. GPU (``gpu`` marker): the inverse launch in bf16 against fp64.
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


@pytest.mark.parametrize("cu", [None, [0, 21, 22, 90, 100]])
def test_inverse_launch_matches_fp64(cu: list[int] | None) -> None:
    B, T, H, D, chunk = (1, 100, 2, 16, 64) if cu else (2, 100, 1, 16, 64)
    w, k = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    beta = torch.rand(B, T, H)
    doc_start = None if cu is None else document_tables(torch.tensor(cu, dtype=torch.int32), T)[0]
    lse = _strict_normalisers(w, k, doc_start, 0.3)
    got = diag_inverse(w, k, beta, lse, doc_start, scale=0.3, chunk=chunk, dot_prec="ieee", inv_prec="ieee")
    want = _expected_inverses(w, k, beta, lse, doc_start, 0.3, chunk)
    last = T - (T - 1) // chunk * chunk  # rows of the last chunk inside the sequence
    assert rel_rms_error(got[:, :-1].double(), want[:, :-1]) < 1e-6
    assert rel_rms_error(got[:, -1, :last, :last].double(), want[:, -1, :last, :last]) < 1e-6


@pytest.mark.parametrize(("probe", "beta_lo", "beta_hi", "tol"),
                         [("random", 0.0, 1.0, 2e-3), ("random", 1.5, 2.0, 2e-3),
                          ("previous", 1.0, 1.0, 1e-4), ("previous", 1.5, 1.5, 2e-2)])
def test_inverse_launch_tf32_operand_paths_match_fp64(probe: str, beta_lo: float, beta_hi: float,
                                                      tol: float) -> None:
    """Under ``tf32`` the doubling takes fp16 operands where the rows of β·P sum to at most
    FP16_SAFE_ROW_SUM (β ≤ 1) and tf32 ones elsewhere. "previous": every row attends to the token before
    it alone, so with β = 1.5 the inverse holds (−1.5)^m and the squarings reach 1.5^32 > 65504, which fp16
    operands would turn into inf; with β = 1 its entries are ±1 (fp16 path, exact)."""
    torch.manual_seed(7)
    B, T, H, D, chunk = 1, 64, 1, 64, 64
    if probe == "random":
        w, k = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    else:  # one-hot keys; row t probes key t − 1 with a score of 40
        k = torch.eye(T)[None, :, None, :D].clone()
        w = 40.0 * torch.roll(k, 1, dims=1)
    beta = beta_lo + (beta_hi - beta_lo) * torch.rand(B, T, H)
    scale = 1.0 if probe == "previous" else 0.3
    lse = _strict_normalisers(w, k, None, scale)
    got = diag_inverse(w, k, beta, lse, None, scale=scale, chunk=chunk, dot_prec="ieee", inv_prec="tf32")
    want = _expected_inverses(w, k, beta, lse, None, scale, chunk)
    assert torch.isfinite(got).all()
    assert rel_rms_error(got.double(), want) < tol


@pytest.mark.parametrize(("D", "Dv", "wave"),
                         [(16, 16, True), (64, 32, True), (16, 80, False), (72, 16, False)])
def test_width_picks_the_backward_solve(D: int, Dv: int, wave: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """width <= 64: one wavefront launch; wider: the superblock solve after the separate inverse launch."""
    called: list[str] = []
    for name in ("wave_backward", "solve_backward", "diag_inverse"):
        real = getattr(passes, name)
        monkeypatch.setattr(passes, name, lambda *a, _real=real, _name=name, **kw: called.append(_name)
                            or _real(*a, **kw))
    check_against_oracle(1, 40, 1, D, Dv, False, None)
    assert called == (["wave_backward"] if wave else ["diag_inverse", "solve_backward", "solve_backward"])


def test_launch_table_gpu_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU rows (docs/kernels_deltaformer.md, "Launch table")."""
    monkeypatch.setattr(config, "interpreting", lambda: False)
    small = config.launch_config(64, 64, 2048)
    assert (small.chunk, small.superblock, small.wave_backward) == (64, 1024, True)
    assert (small.tiles, small.prep, small.prep_registers) == ((64, 64, 4, 3), (64, 64, 4, 3), 128)
    assert (small.wave_forward_launch, small.wave_backward_launch) == ((4, 3), (4, 3))
    assert config.launch_config(32, 64, 8192).superblock == 512
    large = config.launch_config(128, 128, 8192)
    assert (large.superblock, large.backward_superblock, large.wave_backward) == (512, 256, False)
    assert (large.tiles, large.prep_registers, large.wave_forward_launch) == ((128, 64, 8, 3), 0, (8, 2))
    assert (large.solve_launch, large.value_block) == ((8, 2), 64)
    mid = config.launch_config(96, 96, 2048)
    assert (mid.superblock, mid.backward_superblock, mid.value_block) == (1024, 512, 64)
    assert mid.tiles == large.tiles
    # fp32 inputs above 64 columns: smaller row/key tiles (tf32x3 operands in shared memory), nothing else
    fp32 = config.launch_config(128, 128, 8192, fp32=True)
    assert fp32.tiles == (32, 32, 4, 2) and fp32 == dataclasses.replace(large, tiles=fp32.tiles)
    assert config.launch_config(64, 64, 2048, fp32=True) == small
    assert config.launch_config(128, 32, 100).value_block == 32
    with pytest.raises(ValueError, match="<= 128"):
        config.launch_config(256, 64, 100)


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
    got = diag_inverse(w.cuda(), k.cuda(), beta.cuda(), lse.cuda(), None, scale=D**-0.5, chunk=64,
                       dot_prec="tf32", inv_prec="tf32").cpu()
    want = _expected_inverses(w, k, beta, lse, None, D**-0.5, 64)
    err = rel_rms_error(got.double(), want)
    print(f"inverse, beta in ({beta_lo}, {beta_hi}): rel RMS error {err:.2e}")
    assert torch.isfinite(got).all() and err < 2e-3
