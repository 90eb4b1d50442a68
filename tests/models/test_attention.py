"""Sliding-window / full softmax attention: naive reference, window semantics, documents, flex vs dense."""

from __future__ import annotations

import math

import pytest
import torch

from titan_delta.models.context import MixerContext, document_ids
from titan_delta.models.mixers import AttentionConfig, SoftmaxAttention
from titan_delta.models.mixers.attention_masks import build_attention_masks, flex_kernel_options
from titan_delta.testing import assert_rel_close, rel_rms_error


def _mixer(window: int | None, n_kv_heads: int = 2, qk_norm: bool = False) -> SoftmaxAttention:
    config = AttentionConfig(
        dim=24, n_heads=4, n_kv_heads=n_kv_heads, head_dim=6, window=window, qk_norm=qk_norm
    )
    mixer = SoftmaxAttention(config).double()
    mixer.init_weights(0.3, 0.3)
    return mixer


def _context(mixer: SoftmaxAttention, T: int, cu: torch.Tensor | None, backend: str = "sdpa") -> MixerContext:
    doc = document_ids(cu, T) if cu is not None else None
    masks = build_attention_masks({mixer.window}, T, doc, backend, torch.device("cpu"))
    return MixerContext(cu_seqlens=cu, attn_masks=masks)  # no RoPE: the reference below has none


def _naive(mixer: SoftmaxAttention, x: torch.Tensor, window: int | None, doc: torch.Tensor | None):
    """Loop over queries; softmax over exactly the keys the query may see."""
    c = mixer.config
    B, T, _ = x.shape
    q = mixer.wq(x).view(B, T, c.n_heads, c.head_dim)
    k = mixer.wk(x).view(B, T, c.n_kv_heads, c.head_dim)
    v = mixer.wv(x).view(B, T, c.n_kv_heads, c.head_dim)
    if mixer.q_norm is not None:
        q, k = mixer.q_norm(q), mixer.k_norm(k)
    group = c.n_heads // c.n_kv_heads
    out = torch.zeros(B, T, c.n_heads, c.head_dim, dtype=x.dtype)
    for t in range(T):
        keys = [
            i
            for i in range(t + 1)
            if (window is None or t - i < window) and (doc is None or doc[i] == doc[t])
        ]
        for h in range(c.n_heads):
            kk, vv = k[:, keys, h // group], v[:, keys, h // group]
            p = torch.softmax((kk @ q[:, t, h, :, None]).squeeze(-1) / math.sqrt(c.head_dim), dim=-1)
            out[:, t, h] = (p[..., None] * vv).sum(1)
    return mixer.wo(out.reshape(B, T, -1))


@pytest.mark.parametrize("window", [None, 1, 5])
def test_matches_naive_masked_reference(window):
    mixer = _mixer(window, qk_norm=window == 5)
    x = torch.randn(2, 13, 24, dtype=torch.float64)
    assert_rel_close(mixer(x, _context(mixer, 13, None)), _naive(mixer, x, window, None), 1e-12, "attention")


@pytest.mark.parametrize("window", [None, 4])
def test_documents_match_naive_reference(window):
    mixer = _mixer(window)
    cu = torch.tensor([0, 5, 6, 17], dtype=torch.int32)
    x = torch.randn(1, 17, 24, dtype=torch.float64)
    ref = _naive(mixer, x, window, document_ids(cu, 17))
    assert_rel_close(mixer(x, _context(mixer, 17, cu)), ref, 1e-12, "attention with documents")


def test_window_at_least_t_equals_full_and_smaller_window_differs():
    full, swa, narrow = _mixer(None), _mixer(19), _mixer(6)
    swa.load_state_dict(full.state_dict())
    narrow.load_state_dict(full.state_dict())
    x = torch.randn(2, 19, 24, dtype=torch.float64)
    o_full = full(x, _context(full, 19, None))
    assert_rel_close(swa(x, _context(swa, 19, None)), o_full, 1e-12, "W = T vs full")
    o_narrow = narrow(x, _context(narrow, 19, None))
    assert rel_rms_error(o_narrow, o_full) > 1e-3
    assert torch.allclose(o_narrow[:, :6], o_full[:, :6])  # the first W queries see the same keys


@pytest.mark.parametrize(("window", "with_docs"), [(None, True), (7, False), (7, True)])
def test_flex_block_mask_path_matches_dense_path(window, with_docs):
    """FlexAttention runs eagerly (unfused, forward only) on CPU: the GPU path's masks vs dense SDPA."""
    mixer = _mixer(window).float()
    T = 150  # not a multiple of the 128-token mask block
    cu = torch.tensor([0, 40, 41, 133, T], dtype=torch.int32) if with_docs else None
    x = torch.randn(1, T, 24)
    with torch.no_grad():
        dense = mixer(x, _context(mixer, T, cu, "sdpa"))
        flex = mixer(x, _context(mixer, T, cu, "flex"))
    assert_rel_close(flex, dense, 1e-5, "flex vs dense")


def test_flex_block_mask_skips_blocks_outside_the_window():
    masks = build_attention_masks({128}, 1024, None, "flex", torch.device("cpu"))
    sparsity = masks[128].sparsity()
    # 8 query blocks of 128: each touches at most its own and the previous block -> 15 of 64 blocks
    assert sparsity == pytest.approx(100 * (1 - 15 / 64))


def test_missing_mask_for_window_is_an_error():
    mixer = _mixer(4)
    with pytest.raises(RuntimeError, match="window 4"):
        mixer(torch.randn(1, 5, 24, dtype=torch.float64), MixerContext())


def test_flex_kernel_options_only_for_small_heads_on_cuda():
    """Measured backward tiles at head dim <= 64 on CUDA; FlexAttention's defaults elsewhere. Each call gets
    its own dict (flex may keep what it is given)."""
    cuda = torch.device("cuda")
    small = flex_kernel_options(64, cuda)
    assert small is not None and small["BLOCK_M1"] == 32 and small["num_warps"] == 4
    assert flex_kernel_options(64, cuda) is not small
    assert flex_kernel_options(128, cuda) is None
    assert flex_kernel_options(64, torch.device("cpu")) is None
