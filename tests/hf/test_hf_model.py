"""Exports load as transformers models: same logits as ours, generate() with and without a cache, padding."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from titan_delta.models.decoding import greedy_generate

FAMILIES = ("deltaformer", "gated_deltaproduct", "deltaformer_swa", "gated_deltaproduct_swa", "transformer")


def _load(folder):
    return AutoModelForCausalLM.from_pretrained(
        str(folder), trust_remote_code=True, dtype=torch.float32
    ).eval()


def test_config_keeps_titan_delta_keys(exports) -> None:
    _, folder = exports["deltaformer"]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "titan_delta" and config["auto_map"]["AutoModelForCausalLM"]
    assert config["model_name"] == "deltaformer" and config["step"] == 3 and config["tokenizer"] == "default"
    assert config["model_args"]["dim"] == config["hidden_size"] == 64
    for name in ("configuration_titan_delta.py", "modeling_titan_delta.py", "tokenizer.json"):
        assert (folder / name).is_file()


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_generation_match_ours(exports, family) -> None:
    ours, folder = exports[family]
    hf = _load(folder)
    assert set(hf.state_dict()) == set(ours.state_dict())  # parameter names are ours
    tokens = torch.randint(0, ours.model_args.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours(tokens), rtol=1e-5, atol=1e-5)
        expected = greedy_generate(ours, tokens, 6)
    cached = hf.generate(tokens, max_new_tokens=6, do_sample=False)
    uncached = hf.generate(tokens, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached[:, 11:], expected) and torch.equal(uncached[:, 11:], expected)


@pytest.mark.parametrize("family", ["deltaformer_swa", "gated_deltaproduct_swa"])
def test_left_padded_batch_equals_rows_alone(exports, family) -> None:
    """generate() pads prompts of different lengths on the left; pads must not touch a row's state."""
    _, folder = exports[family]
    hf = _load(folder)
    long, short = torch.arange(100, 109)[None], torch.arange(300, 304)[None]
    batch = torch.cat([long, torch.cat([torch.zeros(1, 5, dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    together = hf.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False)
    no_cache = hf.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False, use_cache=False)
    for row, prompt in enumerate((long, short)):
        alone = hf.generate(prompt, max_new_tokens=5, do_sample=False)
        assert torch.equal(together[row, 9:], alone[0, prompt.shape[1] :])
        assert torch.equal(no_cache[row, 9:], alone[0, prompt.shape[1] :])
    with torch.no_grad():  # scoring: logits of the real tokens equal the unpadded row's
        torch.testing.assert_close(hf(batch, attention_mask=mask).logits[1, 5:], hf(short).logits[0])


def test_tied_embeddings_and_loss(tmp_path, small_model) -> None:
    from titan_delta.hf.export_folder import export_model

    ours = small_model("transformer", enable_weight_tying=True)
    export_model(ours, str(tmp_path), model_name="transformer")
    hf = _load(tmp_path)
    assert hf.output.weight.data_ptr() == hf.tok_embeddings.weight.data_ptr()
    tokens = torch.randint(0, ours.model_args.vocab_size, (1, 8))
    with torch.no_grad():
        out = hf(tokens, labels=tokens)
        logits = ours(tokens)
    torch.testing.assert_close(out.logits, logits)
    expected = torch.nn.functional.cross_entropy(logits[0, :-1], tokens[0, 1:])
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_logits_and_generation_match_ours(exports, family) -> None:
    """On a GPU the loaded model runs our Triton kernels, as our own model does."""
    ours, folder = exports[family]
    ours = copy.deepcopy(ours).cuda()  # the shared CPU model stays for the other tests
    hf = _load(folder).cuda()
    tokens = torch.randint(0, ours.model_args.vocab_size, (2, 70), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours(tokens), rtol=1e-4, atol=1e-4)
    cached = hf.generate(tokens, max_new_tokens=6, do_sample=False)
    uncached = hf.generate(tokens, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)
