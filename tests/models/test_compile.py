"""torch.compile(fullgraph=True) of the parts whose code is ours: an SWA block with packed documents
(dense-mask path, RoPE restarting per document) and the document-aware short conv of Gated DeltaProduct.

Whole DeltaFormer / Gated DeltaProduct blocks are not compiled here: they run the ops' PyTorch reference on
CPU, whose compile alone takes minutes (a GDP block without documents compiled fullgraph in 112 s when
measured), and with cu_seqlens the ops validate offsets on the host (a graph break by design).
"""

from __future__ import annotations

import pytest
import torch

from titan_delta.models.components import ShortCausalConv
from titan_delta.models.context import MixerContext, document_ids, positions_in_documents
from titan_delta.models.mixers.attention_masks import build_attention_masks
from titan_delta.testing import assert_rel_close

from .helpers import tiny_model

pytestmark = pytest.mark.slow


def test_swa_block_compiles_fullgraph_with_documents():
    model = tiny_model(mixer="swa", window_size=4)
    block = model.layers["0"]
    T = 16
    cu = torch.tensor([0, 5, 6, T], dtype=torch.int32)
    seq_pos = positions_in_documents(cu, T).unsqueeze(0)
    ctx = MixerContext(
        cu_seqlens=cu,
        seq_pos=seq_pos,
        positions=seq_pos,
        attn_masks=build_attention_masks({4}, T, document_ids(cu, T), "sdpa", torch.device("cpu")),
    )
    x = torch.randn(1, T, 32, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x, ctx)
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    ref = block(x, ctx)
    ref.sum().backward()
    assert_rel_close(out, ref, 1e-5, "compiled SWA block")
    assert_rel_close(grad, x.grad, 1e-5, "compiled SWA block, input gradient")


def test_short_conv_compiles_fullgraph():
    conv = ShortCausalConv(12, kernel_size=4)
    cu = torch.tensor([0, 2, 9, 10], dtype=torch.int64)
    seq_pos = positions_in_documents(cu, 10).unsqueeze(0)
    x = torch.randn(1, 10, 12)
    compiled = torch.compile(conv, fullgraph=True)
    assert_rel_close(compiled(x, seq_pos), conv(x, seq_pos), 1e-6, "compiled short conv")
