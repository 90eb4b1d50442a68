"""CUDA-only checks: compiled FlexAttention (block-sparse masks) against dense SDPA with gradients, a
training step of every debug family on the GPU, and fullgraph compile of an SWA block with a BlockMask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from titan_delta.models import MODEL_FLAVORS, build_model
from titan_delta.models.context import MixerContext, document_ids, positions_in_documents
from titan_delta.models.mixers import AttentionConfig, SoftmaxAttention
from titan_delta.models.mixers.attention_masks import build_attention_masks
from titan_delta.testing import assert_rel_close

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _attention_outputs(mixer, x, cu, backend):
    T = x.shape[1]
    doc = document_ids(cu, T) if cu is not None else None
    seq_pos = positions_in_documents(cu, T).unsqueeze(0) if cu is not None else None
    masks = build_attention_masks({mixer.window}, T, doc, backend, CUDA)
    ctx = MixerContext(cu_seqlens=cu, seq_pos=seq_pos, positions=seq_pos, attn_masks=masks)
    x = x.detach().clone().requires_grad_(True)
    out = mixer(x, ctx)
    out.float().square().sum().backward()
    grads = {name: p.grad.clone() for name, p in mixer.named_parameters()}
    mixer.zero_grad(set_to_none=True)
    return out, x.grad, grads


@pytest.mark.parametrize(("window", "with_docs"), [(None, True), (256, False), (256, True)])
def test_compiled_flex_matches_dense_sdpa_with_gradients(window, with_docs):
    config = AttentionConfig(dim=128, n_heads=8, n_kv_heads=2, head_dim=16, window=window)
    mixer = SoftmaxAttention(config).to(CUDA)
    mixer.init_weights(0.05, 0.05)
    T = 1000  # not a multiple of the 128-token block
    cu = torch.tensor([0, 300, 301, 777, T], dtype=torch.int32, device=CUDA) if with_docs else None
    x = torch.randn(1, T, 128, device=CUDA)
    ref_out, ref_dx, ref_grads = _attention_outputs(mixer, x, cu, "sdpa")
    out, dx, grads = _attention_outputs(mixer, x, cu, "flex")
    assert_rel_close(out, ref_out, 2e-3, "flex output")
    assert_rel_close(dx, ref_dx, 2e-3, "flex input gradient")
    for name, grad in grads.items():
        assert_rel_close(grad, ref_grads[name], 2e-3, f"flex gradient of {name}")


@pytest.mark.parametrize("family", list(MODEL_FLAVORS))
def test_debug_family_training_step_on_cuda(family):
    model = build_model(family, "debug").to(CUDA)
    B, T = 2, 128
    tokens = torch.randint(0, model.model_args.vocab_size, (B, T + 1), device=CUDA)
    cu = torch.tensor([0, 50, 128, 129, 256], dtype=torch.int32, device=CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1], cu_seqlens=cu)
    loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    assert torch.isfinite(loss)
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), f"{family}: gradient of {name}"
    with torch.no_grad():  # the flex (default on CUDA) and dense attention paths agree inside the model
        flex = model(tokens[:, :-1], cu_seqlens=cu)
        model.model_args.attn_backend = "sdpa"
        dense = model(tokens[:, :-1], cu_seqlens=cu)
        model.model_args.attn_backend = "auto"
    assert_rel_close(flex, dense, 2e-3, f"{family}: flex vs dense logits")


def test_swa_block_compiles_fullgraph_with_block_mask():
    model = build_model("deltaformer_swa", "debug", window_size=64).to(CUDA)
    block = model.layers["2"]
    assert block.mixer_name == "swa"
    T = 512
    cu = torch.tensor([0, 100, 101, 400, T], dtype=torch.int32, device=CUDA)
    seq_pos = positions_in_documents(cu, T).unsqueeze(0)
    masks = build_attention_masks({64}, T, document_ids(cu, T), "flex", CUDA)
    ctx = MixerContext(cu_seqlens=cu, seq_pos=seq_pos, positions=seq_pos, attn_masks=masks)
    x = torch.randn(1, T, model.model_args.dim, device=CUDA)
    compiled = torch.compile(block, fullgraph=True)
    assert_rel_close(compiled(x, ctx), block(x, ctx), 2e-3, "compiled SWA block")
