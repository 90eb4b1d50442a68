"""``ModelArgs.attn_rope``: the RoPE/NoPE switch of softmax attention and SWA reaches the mixers, and NoPE
really removes positions (a 1-layer attention model then cannot see token order)."""

from __future__ import annotations

import pytest
import torch

from .helpers import tiny_args, tiny_model


@pytest.mark.parametrize("mixer", ["attention", "swa"])
def test_attn_rope_reaches_the_mixer(mixer: str) -> None:
    assert tiny_model(mixer=mixer).layers["0"].mixer.rope is not None  # default: RoPE, as before
    nope = tiny_model(mixer=mixer, attn_rope=False)
    assert nope.layers["0"].mixer.rope is None and not nope.layers["0"].mixer.config.use_rope


def test_attn_rope_leaves_deltaformer_alone() -> None:
    model = tiny_model(layer_pattern="attention,deltaformer", n_layers=2, attn_rope=False)
    assert model.layers["0"].mixer.rope is None
    assert model.layers["1"].mixer.rope is not None  # deltaformer_rope governs DeltaFormer


@pytest.mark.parametrize("attn_rope", [True, False])
def test_nope_attention_is_blind_to_the_order_of_earlier_tokens(attn_rope: bool) -> None:
    model = tiny_model(torch.float64, mixer="attention", attn_rope=attn_rope)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 9]])
    shuffled = torch.tensor([[5, 3, 7, 1, 2, 6, 4, 9]])  # same multiset before the same last token
    with torch.no_grad():
        gap = float((model(tokens)[0, -1] - model(shuffled)[0, -1]).abs().max())
    assert (gap > 1e-6) if attn_rope else (gap < 1e-10)


def test_nope_allows_an_odd_head_dim_and_rope_does_not() -> None:
    tiny_args(mixer="attention", head_dim=5, attn_rope=False)
    with pytest.raises(ValueError, match="must be even for rotary"):
        tiny_args(mixer="attention", head_dim=5)


@pytest.mark.parametrize("value", [0, "false", None])
def test_attn_rope_must_be_a_bool(value: object) -> None:
    with pytest.raises(ValueError, match="attn_rope must be a bool"):
        tiny_args(attn_rope=value)
