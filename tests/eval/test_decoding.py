"""Cached incremental decoding gives the logits of a full forward, for every mixer and the hybrids."""

from __future__ import annotations

import pytest
import torch

from titan_delta.models.cache import ModelCache
from titan_delta.models.decoding import greedy_generate

from .helpers import HYBRID, tiny_model

CONFIGS = {
    "attention": {"mixer": "attention", "n_kv_heads": 2},
    "swa": {"mixer": "swa", "window_size": 3, "qk_norm": True},
    "deltaformer_linear_k_gqa": {
        "mixer": "deltaformer", "deltaformer_kernel": "linear", "deltaformer_probe": "k", "n_kv_heads": 2,
    },
    "deltaformer_nope_beta1": {"mixer": "deltaformer", "deltaformer_rope": False, "deltaformer_beta": "one"},
    "gated_deltaproduct_neg3": {
        "mixer": "gated_deltaproduct", "gdp_num_householder": 3, "gdp_allow_neg_eigval": True,
    },
    "gated_deltaproduct_bare": {  # the DeltaProduct paper's state-tracking variant
        "mixer": "gated_deltaproduct", "gdp_forget_gate": False, "gdp_short_conv": False,
        "gdp_output_gate": False,
    },
    "hybrid": HYBRID,
}  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decoding_matches_full_forward(name: str) -> None:
    model = tiny_model(**CONFIGS[name])
    tokens = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        full = model(tokens)
        cache = ModelCache.for_model(model)
        pieces = [model(tokens[:, :5], cache=cache)]  # prefill
        pieces += [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 8)]  # one token at a time
        pieces.append(model(tokens[:, 8:], cache=cache))  # a chunk continuing a non-empty cache
    assert cache.seen == 11
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-9, atol=1e-9)


def test_sliding_window_cache_stays_bounded() -> None:
    model = tiny_model(mixer="swa", window_size=4, n_layers=1)
    cache = ModelCache.for_model(model)
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 9)), cache=cache)
        for _ in range(7):
            model(torch.randint(0, 97, (1, 1)), cache=cache)
    assert cache.layer(0).keys.shape[2] == 3  # window − 1 keys: all a later query can still see


def _naive_greedy(model, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    tokens = prompt
    for _ in range(steps):
        tokens = torch.cat((tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)), dim=1)
    return tokens[:, prompt.shape[1] :]


def test_greedy_generate_matches_uncached_argmax_loop() -> None:
    model = tiny_model(**HYBRID)
    prompt = torch.randint(0, 97, (2, 5))
    with torch.no_grad():
        expected = _naive_greedy(model, prompt, 5)
    assert torch.equal(greedy_generate(model, prompt, 5), expected)


def test_greedy_generate_stops_when_every_row_is_finished() -> None:
    model = tiny_model(**HYBRID)
    prompt = torch.randint(0, 97, (2, 4))
    calls = []

    def finished_after_three(generated: torch.Tensor) -> torch.Tensor:
        calls.append(generated.shape[1])
        return torch.full((generated.shape[0],), generated.shape[1] >= 3)

    out = greedy_generate(model, prompt, 10, is_finished=finished_after_three)
    assert out.shape == (2, 3) and calls == [1, 2, 3]


def test_decoding_rejects_bad_input() -> None:
    model = tiny_model(mixer="attention", n_layers=1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_generate(model, torch.zeros(1, 2, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="prompt must have shape"):
        greedy_generate(model, torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="cu_seqlens cannot be combined with cache"):
        model(torch.zeros(1, 4, dtype=torch.long), cu_seqlens=torch.tensor([0, 4]),
              cache=ModelCache.for_model(model))  # fmt: skip
