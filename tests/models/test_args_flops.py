"""Model args (layer patterns, validation, torchtitan hooks), parameter counts and FLOP formulas."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from titan_delta.models import MODEL_FLAVORS, ModelArgs, TitanDeltaLM, build_model, get_model_args
from titan_delta.models.flops import (
    deltaformer_flops,
    gated_deltaproduct_flops,
    mean_keys_per_query,
    softmax_attention_flops,
)

from .helpers import tiny_args

# the tiny config of helpers.py: d=32, 4 heads of 8 (2 kv heads), vocab 97; GDP 2 heads, K=16, V=32, n_h=2
D, V, H, HKV, HD = 32, 97, 4, 2, 8
GDP_H, GDP_K, GDP_V, N_H = 2, 16, 32, 2
FFN = 96  # int(2 · 4 · 32 / 3) = 85, rounded up to a multiple of 16
HAND_MIXER_PARAMS = {
    # wq + wk + wv + wo (+ qk-norm weights)
    "attention": D * H * HD + 2 * D * HKV * HD + H * HD * D + 2 * HD,
    "swa": D * H * HD + 2 * D * HKV * HD + H * HD * D + 2 * HD,
    # same + the β projection (one β per query head)
    "deltaformer": D * H * HD + 2 * D * HKV * HD + H * HD * D + 2 * HD + D * H,
    # q, k (n_h), v (n_h), β (n_h), a, g, o projections; three convs of width 4; A_log, dt_bias; gated norm
    "gated_deltaproduct": D * GDP_H * GDP_K + D * N_H * GDP_H * GDP_K + D * N_H * GDP_H * GDP_V
    + D * N_H * GDP_H + D * GDP_H + D * GDP_H * GDP_V + GDP_H * GDP_V * D
    + 4 * (GDP_H * GDP_K + N_H * GDP_H * GDP_K + N_H * GDP_H * GDP_V) + 2 * GDP_H + GDP_V,
}  # fmt: skip
HAND_GDP_DENSE = HAND_MIXER_PARAMS["gated_deltaproduct"] - 2 * GDP_H - GDP_V  # minus A_log, dt_bias, norm


def _hand_args(mixer: str) -> ModelArgs:
    return tiny_args(mixer=mixer, n_kv_heads=HKV, qk_norm=True, gdp_head_dim=GDP_K, gdp_expand_v=2.0)


@pytest.mark.parametrize("mixer", list(HAND_MIXER_PARAMS))
def test_parameter_count_matches_hand_count(mixer):
    model = TitanDeltaLM(_hand_args(mixer))
    block = 2 * D + 3 * D * FFN + HAND_MIXER_PARAMS[mixer]  # two norms + SwiGLU + mixer
    nparams, _ = model.model_args.get_nparams_and_flops(model, 16)
    assert nparams == V * D + block + D + D * V  # embedding, block, final norm, LM head


def test_mean_keys_per_query_by_enumeration():
    for T in (1, 7, 64, 100):
        assert mean_keys_per_query(T) == pytest.approx(sum(t + 1 for t in range(T)) / T)
        for W in (1, 5, 64, 200):
            assert mean_keys_per_query(T, W) == pytest.approx(sum(min(W, t + 1) for t in range(T)) / T)


def test_mixer_flop_formulas_by_hand():
    T = 10
    # attention: per query t (0-based) t+1 keys, 2·(Dk + Dv) FLOPs per key and head
    full = sum(3 * 2 * 10 * (t + 1) for t in range(T)) / T
    windowed = sum(3 * 2 * 10 * min(4, t + 1) for t in range(T)) / T
    assert softmax_attention_flops(3, 4, 6, T) == pytest.approx(full)
    assert softmax_attention_flops(3, 4, 6, T, 4) == pytest.approx(windowed)
    # DeltaFormer: scores and substitution over the t earlier tokens, then causal attention over t+1
    hand = sum(2 * 4 * t + 2 * 6 * t + 2 * (4 + 6) * (t + 1) for t in range(T)) / T
    assert deltaformer_flops(1, 4, 6, T) == pytest.approx(hand)
    assert deltaformer_flops(1, 4, 6, T) == pytest.approx(2 * T * (4 + 6))
    # GDP, H=1, K=2, V=3, n_h=2, C=4: per step 16 + 16/3 + 16 + 24 + 12 + 12, per query 12 + 16 + 24
    assert gated_deltaproduct_flops(1, 2, 3, 2, chunk_size=4) == pytest.approx(2 * (80 + 16 / 3) + 52)


@pytest.mark.parametrize("mixer", list(HAND_MIXER_PARAMS))
def test_training_flops_per_token_by_hand(mixer):
    args = _hand_args(mixer)
    model = TitanDeltaLM(args)
    T = 48
    dense = 3 * D * FFN + D * V  # SwiGLU + LM head (embedding lookup excluded)
    if mixer == "gated_deltaproduct":
        dense += HAND_GDP_DENSE
        core = gated_deltaproduct_flops(GDP_H, GDP_K, GDP_V, N_H)
    else:
        dense += HAND_MIXER_PARAMS[mixer] - 2 * HD  # qk-norm weights are not matmul weights
        core = {
            "attention": softmax_attention_flops(H, HD, HD, T),
            "swa": softmax_attention_flops(H, HD, HD, T, args.window_size),
            "deltaformer": deltaformer_flops(H, HD, HD, T),
        }[mixer]
    _, flops = args.get_nparams_and_flops(model, T)
    assert flops == int(3 * (2 * dense + core))


def test_tied_lm_head_still_counts_its_matmul():
    tied, untied = TitanDeltaLM(tiny_args(enable_weight_tying=True)), TitanDeltaLM(tiny_args())
    n_tied, f_tied = tied.model_args.get_nparams_and_flops(tied, 16)
    n_untied, f_untied = untied.model_args.get_nparams_and_flops(untied, 16)
    assert n_untied - n_tied == V * D
    assert f_tied == f_untied


def test_layer_patterns():
    assert tiny_args(n_layers=6, layer_pattern="deltaformer*2,swa").layer_mixers() == (
        ("deltaformer", "deltaformer", "swa") * 2
    )
    explicit = ["swa", "attention", "gated_deltaproduct"]
    assert tiny_args(n_layers=3, layer_pattern=explicit).layer_mixers() == tuple(explicit)
    assert tiny_args(n_layers=2, mixer="attention").layer_mixers() == ("attention", "attention")
    model = TitanDeltaLM(tiny_args(n_layers=3, layer_pattern=explicit))
    assert [type(b.mixer).__name__ for b in model.layers.values()] == [
        "SoftmaxAttention", "SoftmaxAttention", "GatedDeltaProduct",
    ]  # fmt: skip
    assert model.attn_windows == {8, None}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"mixer": "mamba"}, "mixer must be one of"),
        ({"n_layers": 3, "layer_pattern": "deltaformer,rwkv,swa"}, "layer 1 has unknown mixer 'rwkv'"),
        ({"n_layers": 4, "layer_pattern": "deltaformer*2,swa"}, "does not divide n_layers=4"),
        ({"n_layers": 2, "layer_pattern": ["swa"]}, "lists 1 mixers but n_layers=2"),
        ({"layer_pattern": "swa*0"}, "repeat count"),
        ({"window_size": 0}, "window_size must be >= 1"),
        ({"window_size": -3}, "window_size must be >= 1"),
        ({"n_heads": 4, "n_kv_heads": 3}, "n_heads=4 must be divisible by n_kv_heads=3"),
        ({"dim": 30}, "dim=30 must be divisible by n_heads=4"),
        ({"head_dim": 7, "mixer": "attention"}, "must be even for rotary"),
        ({"attn_backend": "xformers"}, "attn_backend must be one of"),
        ({"op_backend": "cuda"}, "op_backend must be one of"),
        ({"deltaformer_kernel": "cosine"}, "deltaformer_kernel must be one of"),
        ({"deltaformer_probe": "v"}, "deltaformer_probe must be one of"),
        ({"gdp_num_householder": 0}, "gdp_num_householder must be >= 1"),
        ({"gdp_expand_v": 1.3}, "gdp_expand_v"),
        ({"vocab_size": 0}, "vocab_size must be >= 1"),
    ],
)
def test_bad_configs_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_args(**overrides)


def test_flavor_registry_and_overrides():
    assert set(MODEL_FLAVORS) == {
        "deltaformer", "gated_deltaproduct", "deltaformer_swa", "gated_deltaproduct_swa", "transformer",
    }  # fmt: skip
    for flavors in MODEL_FLAVORS.values():
        assert set(flavors) == {"debug", "340M", "1.3B"}
    assert MODEL_FLAVORS["gated_deltaproduct"]["340M"].gdp_num_householder == 2
    args = get_model_args("deltaformer", "debug", n_layers=2, deltaformer_kernel="linear")
    assert (args.n_layers, args.deltaformer_kernel) == (2, "linear")
    assert MODEL_FLAVORS["deltaformer"]["debug"].n_layers == 3  # the registry entry is untouched
    with pytest.raises(ValueError, match="unknown ModelArgs field"):
        get_model_args("deltaformer", "debug", n_layer=2)
    with pytest.raises(ValueError, match="unknown model family"):
        get_model_args("mamba", "debug")
    with pytest.raises(ValueError, match="unknown flavor"):
        get_model_args("deltaformer", "7B")
    with pytest.raises(ValueError, match="window_size must be >= 1"):
        build_model("deltaformer_swa", "debug", window_size=0)


def test_large_flavors_build_on_meta_with_expected_sizes():
    expected = {"340M": (0.30e9, 0.45e9), "1.3B": (1.2e9, 1.6e9)}
    for family, flavors in MODEL_FLAVORS.items():
        for flavor, (low, high) in expected.items():
            with torch.device("meta"):
                model = TitanDeltaLM(flavors[flavor])
            nparams, flops = model.model_args.get_nparams_and_flops(model, 2048)
            assert low < nparams < high, (family, flavor, nparams)
            assert flops > 6 * (nparams - flavors[flavor].vocab_size * flavors[flavor].dim)


def test_update_from_config_uses_tokenizer_and_seq_len():
    args = get_model_args("transformer", "debug")
    job = SimpleNamespace(training=SimpleNamespace(seq_len=4096))
    args.update_from_config(job, tokenizer=SimpleNamespace(get_vocab_size=lambda: 100277))
    assert (args.vocab_size, args.max_seq_len) == (100277, 4096)
    args.update_from_config(SimpleNamespace(training=SimpleNamespace(seq_len=512)))
    assert (args.vocab_size, args.max_seq_len) == (100277, 512)
