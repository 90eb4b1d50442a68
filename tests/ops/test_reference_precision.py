"""The PyTorch references keep their fp32 math under autocast (the README's contract), so a model trained
with bf16 autocast on the reference path gets fp32 solves, not bf16 ones."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from titan_delta.ops import deltaformer_attn, gated_delta_product


def test_gated_delta_product_reference_ignores_autocast() -> None:
    B, T, H, K, n = 2, 37, 2, 16, 2
    q = torch.randn(B, T, H, K)
    k = F.normalize(torch.randn(B, n * T, H, K), dim=-1)
    v, beta, g = torch.randn(B, n * T, H, K), torch.rand(B, n * T, H), F.logsigmoid(torch.randn(B, T, H))
    expected, _ = gated_delta_product(q, k, v, g, beta, num_householder=n, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = gated_delta_product(q, k, v, g, beta, num_householder=n, backend="torch")
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_deltaformer_reference_ignores_autocast() -> None:
    B, T, H, D = 2, 37, 2, 16
    q, k, v = (torch.randn(B, T, H, D) for _ in range(3))
    beta = torch.rand(B, T, H)
    expected = deltaformer_attn(q, k, v, beta, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = deltaformer_attn(q, k, v, beta, backend="torch")
    assert got.dtype == torch.float32 and torch.equal(got, expected)
