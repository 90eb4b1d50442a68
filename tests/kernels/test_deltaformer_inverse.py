"""Diagonal-block inverses by blocks and block substitution (variant ``invsplit=N``, ``inverse.py``).

CPU (CI): the inverse launch alone against ``torch.linalg.inv`` in fp64 for every split, including the
last partial chunk of a sequence and packed documents; then every path that builds inverses (the fused
preparation, the separate inverse launch, both wavefronts) end to end against the fp64 oracle. GPU
(``gpu`` marker): bf16 at real shapes against the fp32 reference, and agreement with the doubling inverse.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_deltaformer_triton import check_against_oracle, check_variant_on_gpu
from tests.kernels.test_deltaformer_variants import poisoned_buffers_default_variant  # noqa: F401 (autouse)
from titan_delta.testing import rel_rms_error
from titan_delta_kernels.deltaformer._common import LOG2_E, BlockConfig, apply_variant, document_tables
from titan_delta_kernels.deltaformer.solve import diag_inverse


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


@pytest.mark.parametrize("split", [1, 2, 4])
@pytest.mark.parametrize("cu", [None, [0, 21, 22, 90, 100]])
def test_inverse_launch_matches_fp64(split: int, cu: list[int] | None) -> None:
    torch.manual_seed(split)
    B, T, H, D, chunk = (1, 100, 2, 16, 64) if cu else (2, 100, 1, 16, 64)
    w, k = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    beta = torch.rand(B, T, H)
    doc_start = None if cu is None else document_tables(torch.tensor(cu, dtype=torch.int32), T)[0]
    lse = _strict_normalisers(w, k, doc_start, 0.3)
    got = diag_inverse(w, k, beta, lse, doc_start, scale=0.3, chunk=chunk, dot_prec="ieee", inv_prec="ieee",
                       num_warps=4, inv_split=split)
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
    got = diag_inverse(w, k, beta, lse, None, scale=scale, chunk=chunk, dot_prec="ieee", inv_prec="tf32",
                       num_warps=4)
    want = _expected_inverses(w, k, beta, lse, None, scale, chunk)
    assert torch.isfinite(got).all()
    assert rel_rms_error(got.double(), want) < tol


CASES = {
    # name: (variant, B, T, H, D, Dv, separate_w, cu_seqlens)
    "fused_wavesb_wavebwd_split2": ("chunk=32,sb=64,invsplit=2,wavesb,wavebwd", 2, 100, 1, 16, 16, False,
                                    None),
    "full_wave_split2_varlen": ("chunk=32,invsplit=2,wave", 1, 101, 1, 16, 16, True, [0, 3, 50, 50, 101]),
    "unfused_split2_sep_w": ("chunk=32,sb=64,invsplit=2,unfused", 1, 90, 2, 16, 32, True, None),
    "fused_split4_chunk64": ("chunk=64,sb=128,invsplit=4,wavesb,wavebwd", 1, 150, 1, 16, 16, False,
                             [0, 70, 71, 150]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_split_inverse_paths_match_fp64_oracle(case: str) -> None:
    variant, *shape = CASES[case]
    check_against_oracle(*shape, variant=variant)


def test_invsplit_token_parses_and_rejects() -> None:
    base = BlockConfig(chunk=64, superblock=512, value_split=1, num_warps=4, num_stages=2)
    assert apply_variant(base, "invsplit=4").inverse_split == 4
    for bad in ("invsplit=3", "invsplit=8", "invsplit=0"):  # not a power of two / 8-row blocks / zero
        with pytest.raises(ValueError, match="inverse_split"):
            apply_variant(base, bad)
    with pytest.raises(ValueError, match="inverse_split"):
        apply_variant(base, "chunk=16,invsplit=2")


# ----------------------------------------------------------------------------------------------- GPU

GPU_SPLIT_VARIANTS = ["invsplit=2", "invsplit=4", "wave,invsplit=4", "unfused,invsplit=4"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", GPU_SPLIT_VARIANTS)
@pytest.mark.parametrize(("B", "T", "H", "D"), [(2, 1000, 4, 64), (1, 777, 3, 128)])
def test_gpu_split_inverse_matches_fp32_reference(variant: str, B, T, H, D, monkeypatch) -> None:
    check_variant_on_gpu(variant, B, T, H, D, monkeypatch)


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
                       dot_prec="tf32", inv_prec="tf32", num_warps=4).cpu()
    want = _expected_inverses(w, k, beta, lse, None, D**-0.5, 64)
    err = rel_rms_error(got.double(), want)
    print(f"inverse, beta in ({beta_lo}, {beta_hi}): rel RMS error {err:.2e}")
    assert torch.isfinite(got).all() and err < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("split", [2, 4])
def test_gpu_split_inverse_agrees_with_doubling(split: int) -> None:
    torch.manual_seed(0)
    B, T, H, D = 4, 2048, 8, 64
    w, k = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    beta = torch.rand(B, T, H, device="cuda", dtype=torch.bfloat16)
    lse = _strict_normalisers(w.cpu(), k.cpu(), None, D**-0.5).cuda()
    kw = dict(scale=D**-0.5, chunk=64, dot_prec="tf32", inv_prec="tf32", num_warps=4)
    doubling = diag_inverse(w, k, beta, lse, None, **kw)
    split_inv = diag_inverse(w, k, beta, lse, None, inv_split=split, **kw)
    error = rel_rms_error(split_inv, doubling)
    print(f"split {split} vs doubling (tf32 both): {error:.2e}")
    assert error < 2e-3
