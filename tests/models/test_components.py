"""Norms, rotary embeddings, SwiGLU width, fused projections and the document-aware short convolution."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from titan_delta.models.components import (
    GatedRMSNorm,
    RMSNorm,
    RotaryEmbedding,
    ShortCausalConv,
    apply_rotary,
    swiglu_hidden_dim,
)
from titan_delta.models.components.fused_linear import fused_linear, fused_linear_joined
from titan_delta.models.context import document_ids, positions_in_documents
from titan_delta.testing import assert_rel_close


def test_rms_norms_match_formula():
    x, gate = torch.randn(3, 5, 16, dtype=torch.float64), torch.randn(3, 5, 16, dtype=torch.float64)
    norm, gated = RMSNorm(16, eps=1e-6).double(), GatedRMSNorm(16, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.normal_()
        gated.weight.normal_()
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert_rel_close(norm(x), expected * norm.weight, 1e-12, "rmsnorm")
    assert_rel_close(gated(x, gate), expected * gated.weight * F.silu(gate), 1e-12, "gated rmsnorm")


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(8, theta=10000.0)
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)

    def score(pos_q: int, pos_k: int) -> torch.Tensor:
        cq, sq = rope(torch.tensor([[pos_q]]))
        ck, sk = rope(torch.tensor([[pos_k]]))
        return (apply_rotary(q, cq.double(), sq.double()) * apply_rotary(k, ck.double(), sk.double())).sum()

    assert torch.allclose(score(7, 3), score(104, 100), atol=1e-5)
    assert not torch.allclose(score(7, 3), score(7, 4), atol=1e-3)
    cos, sin = rope(torch.zeros(1, 1, dtype=torch.long))
    assert torch.equal(apply_rotary(q, cos, sin), q)  # position 0 is the identity


def test_fused_linear_matches_separate_linears():
    torch.manual_seed(0)
    linears = [
        torch.nn.Linear(12, 8, bias=False),
        torch.nn.Linear(12, 3, bias=True),  # one bias among bias-free projections
        torch.nn.Linear(12, 2, bias=False),  # 13 outputs: padded to 16 for aligned rows
    ]
    linears = [linear.double() for linear in linears]
    x = torch.randn(2, 7, 12, dtype=torch.float64, requires_grad=True)
    fused = fused_linear(x, *linears)
    separate = [linear(x) for linear in linears]
    assert [tuple(t.shape) for t in fused] == [(2, 7, 8), (2, 7, 3), (2, 7, 2)]
    assert all(t.stride(-2) == 16 for t in fused)
    weights = [torch.randn_like(t) for t in separate]
    params = [x] + [p for linear in linears for p in linear.parameters()]

    def grads(outputs):
        return torch.autograd.grad(sum((w * t).sum() for w, t in zip(weights, outputs, strict=True)), params)

    grads_fused, grads_separate = grads(fused), grads(separate)
    for i, (a, b) in enumerate(zip(fused, separate, strict=True)):
        assert_rel_close(a, b, 1e-12, f"output {i}")
    for i, (a, b) in enumerate(zip(grads_fused, grads_separate, strict=True)):
        assert_rel_close(a, b, 1e-12, f"gradient {i}")
    partial = torch.autograd.grad((weights[0] * fused_linear(x, *linears)[0]).sum(), x)[0]
    assert_rel_close(partial, weights[0] @ linears[0].weight, 1e-12, "gradient of one piece")
    (single,) = fused_linear(x, linears[1])
    assert_rel_close(single, separate[1], 1e-12, "one linear")
    joined = fused_linear_joined(x, *linears)  # the 13 columns of the padded output, as one tensor
    assert joined.shape == (2, 7, 13) and joined.stride(-2) == 16
    assert_rel_close(joined, torch.cat(separate, -1), 1e-12, "joined")
    aligned = fused_linear_joined(x, linears[0], linears[0])  # 16 columns: the GEMM's output itself
    assert aligned.is_contiguous() and aligned.shape == (2, 7, 16)
    padded = fused_linear_joined(x, *linears, padded=True)  # the 13 columns, then 3 of zero padding
    assert padded.is_contiguous() and padded.shape == (2, 7, 16)
    assert torch.equal(padded[..., :13], joined) and not padded[..., 13:].any()


def test_swiglu_hidden_dim_rounding():
    assert swiglu_hidden_dim(1024) == 2816
    assert swiglu_hidden_dim(2048) == 5632
    assert swiglu_hidden_dim(64, multiple_of=32) == 192


def test_short_conv_matches_conv1d_without_documents():
    conv = ShortCausalConv(6, kernel_size=4).double()
    x = torch.randn(2, 11, 6, dtype=torch.float64)
    ref = F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), conv.weight, groups=6).transpose(1, 2)
    assert_rel_close(conv(x), F.silu(ref), 1e-12, "short conv")
    short = torch.randn(1, 2, 6, dtype=torch.float64)  # T < kernel size
    ref_short = F.conv1d(F.pad(short.transpose(1, 2), (3, 0)), conv.weight, groups=6).transpose(1, 2)
    assert_rel_close(conv(short), F.silu(ref_short), 1e-12, "short conv, T < K")


def test_short_conv_never_crosses_documents():
    conv = ShortCausalConv(5, kernel_size=4).double()
    lengths = [3, 1, 6, 2]
    cu = torch.tensor([0, 3, 4, 10, 12], dtype=torch.int32)
    x = torch.randn(1, 12, 5, dtype=torch.float64)
    packed = conv(x, positions_in_documents(cu, 12).unsqueeze(0))
    alone = torch.cat([conv(part) for part in x.split(lengths, dim=1)], dim=1)
    assert_rel_close(packed, alone, 1e-12, "packed conv vs per-document conv")


def test_document_ids_and_positions():
    cu = torch.tensor([0, 2, 2, 5, 6], dtype=torch.int64)  # includes an empty document
    assert document_ids(cu, 6).tolist() == [0, 0, 2, 2, 2, 3]
    assert positions_in_documents(cu, 6).tolist() == [0, 1, 0, 1, 2, 0]
