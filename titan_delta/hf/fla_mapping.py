"""flash-linear-attention (FLA) checkpoints → titan-delta ``ModelArgs`` and parameter names.

Covers FLA's ``GatedDeltaProductForCausalLM`` (``model_type = "gated_deltaproduct"``) and
``DeltaFormerForCausalLM`` (``"deltaformer"``), including their ``attn`` hybrids (standard or
sliding-window attention at listed layers), as FLA 0.6 names them. A setting our layers cannot reproduce
exactly is refused with ``FLAMappingError`` naming it, never approximated. What still differs
numerically (normalisation epsilons) is listed in docs/hf.md.

Block layout (both): ``model.embeddings`` → ``tok_embeddings``, ``model.layers.i.{attn_norm, attn,
mlp_norm, mlp}`` → ``layers.i.{mixer_norm, mixer, mlp_norm, mlp}`` with the GatedMLP's ``gate/up/down_proj``
→ SwiGLU ``w1/w3/w2``, ``model.norm`` → ``norm``, ``lm_head`` → ``output``.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from titan_delta.models import ModelArgs

FLA_MODEL_TYPES = ("gated_deltaproduct", "deltaformer")


class FLAMappingError(ValueError):
    """The FLA checkpoint uses a setting titan-delta's layers do not compute; the message names it."""


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise FLAMappingError(message)


def _attention_specs(config: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Layer → FLA attention spec (defaults filled in as FLA's ``parse_attention_config`` does)."""
    attn = config.get("attn")
    specs = [] if attn is None else [attn] if isinstance(attn, dict) else list(attn)
    layers: dict[int, dict[str, Any]] = {}
    for spec in specs:
        spec = {"num_kv_heads": None, "qkv_bias": False, "window_size": None, "rope_theta": 10000.0, **spec}
        spec["num_kv_heads"] = spec["num_kv_heads"] or spec["num_heads"]
        _need(not spec["qkv_bias"], "attn.qkv_bias = true: our attention layers have no q/k/v biases")
        for layer in spec["layers"]:
            layers[int(layer)] = spec
    return layers


def _mlp_width(config: dict[str, Any]) -> int:
    """FLA's GatedMLP width: intermediate_size, else 2/3 · hidden_ratio · hidden_size rounded up to 256."""
    if config.get("intermediate_size"):
        return int(config["intermediate_size"])
    hidden = int(config["hidden_size"] * (config.get("hidden_ratio") or 4) * 2 / 3)
    return 256 * ((hidden + 255) // 256)


def _layer_pattern(
    config: dict[str, Any], native: str, fields: dict[str, Any]
) -> tuple[list[str] | None, dict[str, Any]]:
    """Per-layer mixer names and the attention fields a hybrid adds (heads, window, RoPE base)."""
    n_layers = int(config["num_hidden_layers"])
    specs = _attention_specs(config)
    if not specs:
        return None, {}
    distinct = {(s["num_heads"], s["num_kv_heads"], float(s["rope_theta"])) for s in specs.values()}
    _need(
        len(distinct) == 1, f"attn layers differ in heads or rope_theta ({sorted(distinct)}); ours share them"
    )
    heads, kv_heads, theta = distinct.pop()
    windows = {s["window_size"] for s in specs.values()} - {None}
    _need(len(windows) <= 1, f"attn layers use several window sizes {sorted(windows)}; ours share one")
    if native == "deltaformer":
        same = (heads, kv_heads, theta) == (fields["n_heads"], fields["n_kv_heads"], fields["rope_theta"])
        _need(same, "attn layers and DeltaFormer layers differ in heads or rope_theta; ours share them")
    extra: dict[str, Any] = {"n_heads": heads, "n_kv_heads": kv_heads, "rope_theta": theta}
    if windows:
        extra["window_size"] = windows.pop()
    names = [
        native if i not in specs else ("swa" if specs[i]["window_size"] is not None else "attention")
        for i in range(n_layers)
    ]
    return names, extra


def _common_fields(config: dict[str, Any]) -> dict[str, Any]:
    _need(
        config.get("attnres_block_size") is None,
        "attnres_block_size is set: attention residuals are not ours",
    )
    _need(
        config.get("hidden_act", "swish") == "swish",
        f"hidden_act = {config.get('hidden_act')!r}: ours is swish",
    )
    return {
        "dim": int(config["hidden_size"]),
        "n_layers": int(config["num_hidden_layers"]),
        "vocab_size": int(config["vocab_size"]),
        "max_seq_len": int(config.get("max_position_embeddings") or 2048),
        "ffn_hidden_dim": _mlp_width(config),
        "norm_eps": float(config.get("norm_eps", 1e-6)),
        "enable_weight_tying": bool(config.get("tie_word_embeddings", False)),
    }


def fla_model_args(config: dict[str, Any]) -> ModelArgs:
    """``ModelArgs`` that compute what the FLA config describes (``FLAMappingError`` if nothing does)."""
    model_type = config.get("model_type")
    _need(model_type in FLA_MODEL_TYPES, f"model_type {model_type!r}: expected one of {FLA_MODEL_TYPES}")
    fields = _common_fields(config)
    if model_type == "gated_deltaproduct":
        heads = int(config.get("num_heads", 6))
        v_heads = config.get("num_v_heads")
        _need(v_heads in (None, heads), f"num_v_heads = {v_heads} != num_heads: ours has no grouped values")
        fields.update(
            mixer="gated_deltaproduct",
            n_heads=heads if fields["dim"] % heads == 0 else 1,  # unused unless attention layers set it
            gdp_n_heads=heads,
            gdp_head_dim=int(config.get("head_dim", 256)),
            gdp_expand_v=float(config.get("expand_v", 2.0)),
            gdp_num_householder=int(config.get("num_householder", 1)),
            gdp_allow_neg_eigval=bool(config.get("allow_neg_eigval", False)),
            gdp_forget_gate=bool(config.get("use_forget_gate", False)),
            gdp_short_conv=bool(config.get("use_short_conv", True)),
            gdp_conv_size=int(config.get("conv_size", 4)),
            gdp_output_gate=bool(config.get("use_output_gate", True)),
        )
    else:
        heads = int(config.get("num_heads", 8))
        kv_heads = int(config.get("num_kv_heads") or heads)
        _need(
            kv_heads == heads, f"num_kv_heads = {kv_heads} != num_heads: FLA's DeltaFormer GQA is not mapped"
        )
        _need(not config.get("qkv_bias", False), "qkv_bias = true: our DeltaFormer has no q/k/v biases")
        fields.update(
            mixer="deltaformer",
            n_heads=heads,
            n_kv_heads=kv_heads,
            qk_norm=bool(config.get("qk_norm", False)),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            deltaformer_kernel="softmax",
            deltaformer_probe="q",
            deltaformer_beta="linear",  # FLA: β = b_proj(x), an affine map with bias, no sigmoid
            deltaformer_rope=True,
        )
    names, attention = _layer_pattern(config, fields["mixer"], fields)
    fields.update(attention, layer_pattern=names)
    try:
        return ModelArgs(**fields)
    except (TypeError, ValueError) as err:
        raise FLAMappingError(f"the FLA config maps to invalid ModelArgs: {err}") from err


_BLOCK = {
    r"attn_norm\.weight": "mixer_norm.weight",
    r"mlp_norm\.weight": "mlp_norm.weight",
    r"mlp\.gate_proj\.weight": "mlp.w1.weight",
    r"mlp\.up_proj\.weight": "mlp.w3.weight",
    r"mlp\.down_proj\.weight": "mlp.w2.weight",
}
_ATTENTION = {r"attn\.([qkvo])_proj\.weight": r"mixer.w\1.weight"}
_DELTAFORMER = {
    **_ATTENTION,
    r"attn\.b_proj\.(weight|bias)": r"mixer.w_beta.\1",
    r"attn\.([qk])_norm\.weight": r"mixer.\1_norm.weight",
}
_GATED_DELTAPRODUCT = {
    r"attn\.([qkvbago])_proj\.weight": r"mixer.\1_proj.weight",
    r"attn\.(A_log|dt_bias)": r"mixer.\1",
    r"attn\.([qkv])_conv1d\.weight": r"mixer.\1_conv.weight",
    r"attn\.o_norm\.weight": "mixer.o_norm.weight",
}
_MIXER_RULES = {
    "attention": _ATTENTION,
    "swa": _ATTENTION,
    "deltaformer": _DELTAFORMER,
    "gated_deltaproduct": _GATED_DELTAPRODUCT,
}
_TOP = {"model.embeddings.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "output.weight"}  # fmt: skip
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def fla_state_dict(state: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """FLA parameter names → ours (shapes are checked when the result is loaded into ``TitanDeltaLM``).
    A tensor no rule maps (a bias our layers lack, a conv bias, ...) is an error naming it."""
    mixers = args.layer_mixers()
    mapped: dict[str, torch.Tensor] = {}
    unmapped: list[str] = []
    for key, tensor in state.items():
        if key in _TOP:
            mapped[_TOP[key]] = tensor
            continue
        match = _LAYER_KEY.match(key)
        layer, rest = (int(match.group(1)), match.group(2)) if match else (-1, "")
        name = None
        if 0 <= layer < len(mixers):
            for pattern, target in {**_BLOCK, **_MIXER_RULES[mixers[layer]]}.items():
                if re.fullmatch(pattern, rest):
                    name = f"layers.{layer}." + re.sub(pattern, target, rest)
                    break
        if name is None:
            unmapped.append(key)
        else:
            mapped[name] = tensor
    _need(not unmapped, f"FLA tensors with no titan-delta counterpart: {unmapped[:5]}")
    return mapped
