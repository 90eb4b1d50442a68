"""End-to-end model behaviour: every family trains a step, packed documents stay independent, weight tying,
deterministic init, explicit positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from titan_delta.models import MODEL_FLAVORS, TitanDeltaLM, build_model, count_parameters
from titan_delta.testing import assert_rel_close, rel_rms_error

from .helpers import MIXERS, tiny_model


@pytest.mark.parametrize("family", list(MODEL_FLAVORS))
def test_debug_flavor_forward_backward(family):
    model = build_model(family, "debug")
    tokens = torch.randint(0, model.model_args.vocab_size, (2, 33))
    logits = model(tokens[:, :-1])
    assert logits.shape == (2, 32, model.model_args.vocab_size)
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    assert torch.isfinite(loss)
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{family}: no gradient for {name}"
        assert torch.isfinite(param.grad).all(), f"{family}: non-finite gradient for {name}"
        assert param.grad.abs().sum() > 0, f"{family}: zero gradient for {name}"


@pytest.mark.parametrize("family", list(MODEL_FLAVORS))
def test_every_family_is_causal(family):
    """Changing the tokens after position t leaves every logit at positions <= t unchanged (fp64); a leak
    from the future would make the loss drop for the wrong reason."""
    model = build_model(family, "debug").double()
    T, cut = 41, 23  # cut inside a chunk, and T not a multiple of any chunk size
    tokens = torch.randint(0, model.model_args.vocab_size, (2, T))
    changed = tokens.clone()
    changed[:, cut + 1 :] = torch.randint(0, model.model_args.vocab_size, (2, T - cut - 1))
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert_rel_close(after[:, : cut + 1], before[:, : cut + 1], 1e-12, f"{family}: logits up to the cut")
    assert rel_rms_error(after[:, cut + 1 :], before[:, cut + 1 :]) > 1e-3  # the change is seen later


@pytest.mark.parametrize("pattern", [*[(m,) for m in MIXERS], ("gated_deltaproduct", "swa", "deltaformer")])
def test_packed_documents_match_documents_run_alone(pattern):
    """Offsets index the flattened B·T stream; the row boundary at T is also a document boundary."""
    model = tiny_model(torch.float64, n_layers=len(pattern), layer_pattern=list(pattern), window_size=3)
    B, T = 2, 12
    tokens = torch.randint(0, 97, (B, T))
    cu = torch.tensor([0, 5, 6, 12, 15, 24], dtype=torch.int32)
    logits = model(tokens, cu_seqlens=cu)
    flat_tokens, flat_logits = tokens.reshape(-1), logits.reshape(B * T, -1)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        alone = model(flat_tokens[None, start:end])[0]
        assert_rel_close(flat_logits[start:end], alone, 1e-10, f"{pattern} document [{start}, {end})")
    unpacked = model(tokens)  # without cu_seqlens the documents do see each other
    assert rel_rms_error(unpacked, logits) > 1e-6


@pytest.mark.parametrize("mixer", MIXERS)
def test_batch_rows_are_independent_and_bf16_tracks_fp32(mixer):
    model = tiny_model(mixer=mixer, n_layers=2)
    tokens = torch.randint(0, 97, (3, 10))
    logits = model(tokens)
    assert_rel_close(logits[1:2], model(tokens[1:2]), 1e-5, f"{mixer} row 1")
    bf16 = model.to(torch.bfloat16)(tokens)
    assert bf16.dtype == torch.bfloat16
    assert_rel_close(bf16.float(), logits, 3e-2, f"{mixer} bf16 vs fp32")


def test_explicit_position_ids():
    model = tiny_model(torch.float64, mixer="attention", n_layers=2)
    tokens = torch.randint(0, 97, (2, 9))
    default = model(tokens)
    same = model(tokens, position_ids=torch.arange(9).expand(2, 9))
    assert_rel_close(same, default, 1e-12, "explicit default positions")
    shifted = model(tokens, position_ids=torch.arange(9).expand(2, 9) + 5)
    assert_rel_close(shifted, default, 1e-9, "RoPE attention is shift-invariant")
    nope = tiny_model(torch.float64, mixer="deltaformer", deltaformer_rope=False)
    assert nope.layers["0"].mixer.rope is None
    with pytest.raises(ValueError, match="position_ids must have shape"):
        model(tokens, position_ids=torch.arange(9))


def test_tied_embeddings_share_storage_and_survive_meta_init():
    model = tiny_model(enable_weight_tying=True)
    assert model.output.weight is model.tok_embeddings.weight
    untied = tiny_model(enable_weight_tying=False)
    assert count_parameters(untied) - count_parameters(model) == 97 * 32
    with torch.device("meta"):
        meta_model = TitanDeltaLM(model.model_args)
    meta_model.to_empty(device="cpu")
    meta_model.init_weights(buffer_device=torch.device("cpu"))
    assert meta_model.output.weight.data_ptr() == meta_model.tok_embeddings.weight.data_ptr()
    assert torch.isfinite(meta_model(torch.randint(0, 97, (1, 5)))).all()


def test_init_is_deterministic_given_the_seed():
    def weights(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        model = tiny_model(n_layers=3, layer_pattern="gated_deltaproduct,deltaformer,swa")
        torch.manual_seed(seed + 1)  # init_weights must depend only on the RNG state when it is called
        model.init_weights()
        return model.state_dict()

    first, again, other = weights(3), weights(3), weights(4)
    for name, value in first.items():
        assert torch.equal(value, again[name]), name
    assert not torch.equal(first["layers.0.mixer.A_log"], other["layers.0.mixer.A_log"])
    A = first["layers.0.mixer.A_log"].exp()
    assert ((A >= 1) & (A <= 16)).all()
    dt = F.softplus(first["layers.0.mixer.dt_bias"])
    assert ((dt >= 1e-3 - 1e-7) & (dt <= 1e-1 + 1e-7)).all()


def test_bad_forward_inputs():
    model = tiny_model()
    with pytest.raises(ValueError, match="tokens must have shape"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="cu_seqlens must be a 1-D int32/int64"):
        model(torch.zeros(1, 5, dtype=torch.long), cu_seqlens=torch.tensor([0.0, 5.0]))


@pytest.mark.parametrize("mixer", MIXERS)
def test_bf16_autocast_forward_backward(mixer):
    """bf16 autocast end to end (CUDA autocast also runs normalize in fp32: test_gpu covers that case)."""
    model = tiny_model(mixer=mixer)
    tokens = torch.randint(0, 97, (2, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens, cu_seqlens=torch.tensor([0, 4, 9, 18], dtype=torch.int32))
    loss = logits.float().logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
