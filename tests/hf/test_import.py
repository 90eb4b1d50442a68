"""tools/import_checkpoint: our exports and FLA checkpoints → a DCP step-0 the trainer loads."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torchtitan.components.checkpoint import ModelWrapper

from titan_delta.hf.export_cli import export
from titan_delta.hf.import_cli import main as import_main
from titan_delta.hf.importer import load_hf_model, trainer_settings
from titan_delta.models import TitanDeltaLM
from titan_delta.models.context import MixerContext
from titan_delta.trainer.checkpoint import checkpoint_problem
from titan_delta.trainer.model_overrides import resolve_model_args

REPO_DEBUG_CONFIG = "train_configs/debug.toml"  # [model] deltaformer/debug, seq_len 256, default tokenizer


def _trainer_load(args, step_dir) -> TitanDeltaLM:
    """What torchtitan's checkpointer does with --checkpoint.initial_load_path (model-only DCP load)."""
    with torch.device("meta"):
        model = TitanDeltaLM(args)
    model.to_empty(device="cpu")
    wrapper = ModelWrapper(model)
    state = wrapper.state_dict()
    dcp.load(state, checkpoint_id=str(step_dir))
    wrapper.load_state_dict(state)
    return model.eval()


def test_export_import_round_trip(exports, tmp_path) -> None:
    ours, folder = exports["deltaformer"]
    assert import_main(["--hf", str(folder), "--out", str(tmp_path / "imported")]) == 0
    step_dir = tmp_path / "imported" / "step-0"
    assert checkpoint_problem(str(step_dir)) is None  # COMPLETE.json with the file list
    marker = json.loads((step_dir / "COMPLETE.json").read_text())
    assert marker["step"] == 0 and marker["resumable"] is False
    described = json.loads((tmp_path / "imported" / "import.json").read_text())
    assert (
        described["trainer"]["model.name"] == "deltaformer"
        and described["trainer"]["model.flavor"] == "debug"
    )
    assert described["trainer"]["data.tokenizer"] == "default"
    tokens = torch.randint(0, ours.model_args.vocab_size, (2, 12))
    loaded = _trainer_load(ours.model_args, step_dir)
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), ours(tokens), rtol=0, atol=0)
    # and back out through the exporter, which reads the DCP folder like any training checkpoint
    again = export(str(step_dir), REPO_DEBUG_CONFIG, str(tmp_path / "again"))
    with torch.no_grad():
        torch.testing.assert_close(load_hf_model(again).model(tokens), ours(tokens), rtol=0, atol=0)


def test_refuses_what_it_cannot_map(exports, tmp_path, capsys) -> None:
    _, folder = exports["transformer"]
    config = json.loads((folder / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    save_file({"x": torch.zeros(1)}, bad / "model.safetensors")
    assert import_main(["--hf", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "model_type 'llama'" in capsys.readouterr().err
    (bad / "config.json").write_text(json.dumps(config))  # right config, wrong weights
    assert import_main(["--hf", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "missing" in capsys.readouterr().err


# ---------------------------------------------------------------- flash-linear-attention checkpoints
D, H, K, V, N, FFN, VOCAB = 64, 2, 32, 64, 2, 256, 512  # FLA's GatedMLP width for d=64: 256·⌈170/256⌉


def _fla_gdp_checkpoint(folder) -> dict[str, torch.Tensor]:
    """A GatedDeltaProductForCausalLM folder with FLA 0.6's parameter names and shapes (layers 0, 1 Gated
    DeltaProduct, layer 2 sliding-window attention of 4 heads) and random weights."""
    config = {
        "model_type": "gated_deltaproduct",
        "architectures": ["GatedDeltaProductForCausalLM"],
        "hidden_size": D,
        "num_hidden_layers": 3,
        "num_heads": H,
        "head_dim": K,
        "expand_v": V / K,
        "num_householder": N,
        "allow_neg_eigval": True,
        "use_forget_gate": True,
        "use_short_conv": True,
        "conv_size": 4,
        "use_output_gate": True,
        "hidden_ratio": 4,
        "intermediate_size": None,
        "hidden_act": "swish",
        "norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "fuse_norm": True,
        "fuse_swiglu": True,
        "attnres_block_size": None,
        "attn": {"layers": [2], "num_heads": 4, "num_kv_heads": 2, "window_size": 8, "rope_theta": 10000.0},
    }
    shapes = {"model.embeddings.weight": (VOCAB, D), "model.norm.weight": (D,), "lm_head.weight": (VOCAB, D)}
    for i in range(3):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "attn_norm.weight": (D,),
                p + "mlp_norm.weight": (D,),
                p + "mlp.gate_proj.weight": (FFN, D),
                p + "mlp.up_proj.weight": (FFN, D),
                p + "mlp.down_proj.weight": (D, FFN),
            }
        )
    for i in range(2):
        p = f"model.layers.{i}.attn."
        shapes.update(
            {
                p + "q_proj.weight": (H * K, D),
                p + "k_proj.weight": (N * H * K, D),
                p + "v_proj.weight": (N * H * V, D),
                p + "b_proj.weight": (N * H, D),
                p + "a_proj.weight": (H, D),
                p + "A_log": (H,),
                p + "dt_bias": (H,),
                p + "q_conv1d.weight": (H * K, 1, 4),
                p + "k_conv1d.weight": (N * H * K, 1, 4),
                p + "v_conv1d.weight": (N * H * V, 1, 4),
                p + "g_proj.weight": (H * V, D),
                p + "o_norm.weight": (V,),
                p + "o_proj.weight": (D, H * V),
            }
        )
    p = "model.layers.2.attn."
    shapes.update(
        {
            p + "q_proj.weight": (D, D),
            p + "k_proj.weight": (32, D),
            p + "v_proj.weight": (32, D),
            p + "o_proj.weight": (D, D),
        }
    )
    generator = torch.Generator().manual_seed(0)
    state = {name: torch.randn(shape, generator=generator) * 0.1 for name, shape in shapes.items()}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, folder / "model.safetensors")
    return state


def test_fla_gated_deltaproduct_names_and_config(tmp_path) -> None:
    fla = _fla_gdp_checkpoint(tmp_path / "fla")
    imported = load_hf_model(str(tmp_path / "fla"))
    args, ours = imported.model.model_args, imported.model.state_dict()
    assert args.layer_mixers() == ("gated_deltaproduct", "gated_deltaproduct", "swa")
    assert (args.gdp_num_householder, args.gdp_allow_neg_eigval, args.gdp_forget_gate) == (N, True, True)
    assert (args.window_size, args.n_heads, args.kv_heads, args.ffn_dim) == (8, 4, 2, FFN)
    expected = {
        "tok_embeddings.weight": "model.embeddings.weight",
        "output.weight": "lm_head.weight",
        "norm.weight": "model.norm.weight",
        "layers.1.mixer_norm.weight": "model.layers.1.attn_norm.weight",
        "layers.2.mlp.w1.weight": "model.layers.2.mlp.gate_proj.weight",
        "layers.2.mlp.w3.weight": "model.layers.2.mlp.up_proj.weight",
        "layers.2.mlp.w2.weight": "model.layers.2.mlp.down_proj.weight",
        "layers.0.mixer.k_proj.weight": "model.layers.0.attn.k_proj.weight",
        "layers.0.mixer.b_proj.weight": "model.layers.0.attn.b_proj.weight",
        "layers.0.mixer.A_log": "model.layers.0.attn.A_log",
        "layers.0.mixer.dt_bias": "model.layers.0.attn.dt_bias",
        "layers.1.mixer.v_conv.weight": "model.layers.1.attn.v_conv1d.weight",
        "layers.1.mixer.o_norm.weight": "model.layers.1.attn.o_norm.weight",
        "layers.1.mixer.g_proj.weight": "model.layers.1.attn.g_proj.weight",
        "layers.2.mixer.wq.weight": "model.layers.2.attn.q_proj.weight",
        "layers.2.mixer.wo.weight": "model.layers.2.attn.o_proj.weight",
    }
    for name, fla_name in expected.items():
        assert torch.equal(ours[name], fla[fla_name]), name
    assert len(ours) == len(fla)  # every FLA tensor has exactly one home
    assert imported.family_flavor is None  # no registered flavor is this small hybrid
    with torch.no_grad():
        assert torch.isfinite(imported.model(torch.randint(0, VOCAB, (1, 12)))).all()
    # ... but a flavor with [model] field overrides builds it: the trainer can continue from the import
    settings = trainer_settings(imported)
    assert "problem" not in settings
    overrides = {k.removeprefix("model."): v for k, v in settings.items() if k.startswith("model.")}
    family, flavor = overrides.pop("name"), overrides.pop("flavor")
    rebuilt = resolve_model_args(family, flavor, overrides)
    rebuilt = dataclasses.replace(rebuilt, vocab_size=args.vocab_size)
    shapes = {k: v.shape for k, v in TitanDeltaLM(rebuilt).state_dict().items()}
    assert shapes == {k: v.shape for k, v in ours.items()}


def test_fla_refuses_settings_ours_lacks(tmp_path) -> None:
    from titan_delta.hf.fla_mapping import FLAMappingError, fla_model_args

    base = {
        "model_type": "gated_deltaproduct",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "vocab_size": 64,
        "num_heads": 2,
        "head_dim": 32,
    }
    for bad, field in (
        ({"num_v_heads": 4}, "num_v_heads"),
        ({"attnres_block_size": 2}, "attnres"),
        ({"attn": {"layers": [1], "num_heads": 2, "qkv_bias": True}}, "qkv_bias"),
    ):
        with pytest.raises(FLAMappingError, match=field):
            fla_model_args({**base, **bad})


def _fla_naive_deltaformer(q, k, v, beta):
    """The formula FLA 0.6's naive DeltaFormer reference computes, written out here from the math: stage 1
    with strictly causal softmax of q·k and the raw β, stage 2 causal softmax attention over u."""
    T, scale = q.shape[1], q.shape[-1] ** -0.5
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    strict = torch.ones(T, T, dtype=torch.bool).tril(-1)
    probs = torch.softmax(scores.masked_fill(~strict, -math.inf), dim=-1).nan_to_num(0.0)
    u = []
    for t in range(T):
        correction = sum((probs[:, :, t, s, None] * u[s] for s in range(t)), torch.zeros_like(v[:, 0]))
        u.append(v[:, t] - beta[:, t, :, None] * correction)
    u = torch.stack(u, dim=1)
    attn = torch.softmax(
        scores.masked_fill(~strict.logical_or(torch.eye(T, dtype=torch.bool)), -math.inf), -1
    )
    return torch.einsum("bhts,bshd->bthd", attn, u)


def test_fla_deltaformer_layer_math(tmp_path) -> None:
    """FLA's DeltaFormer layer: β = b_proj(x) with a bias and no sigmoid, probe q, RoPE before both stages."""
    config = {
        "model_type": "deltaformer",
        "hidden_size": D,
        "num_hidden_layers": 1,
        "num_heads": 4,
        "vocab_size": VOCAB,
        "hidden_ratio": 4,
        "norm_eps": 1e-6,
        "qk_norm": False,
    }
    generator = torch.Generator().manual_seed(0)
    shapes = {
        "model.embeddings.weight": (VOCAB, D),
        "model.norm.weight": (D,),
        "lm_head.weight": (VOCAB, D),
        "model.layers.0.attn_norm.weight": (D,),
        "model.layers.0.mlp_norm.weight": (D,),
        "model.layers.0.mlp.gate_proj.weight": (FFN, D),
        "model.layers.0.mlp.up_proj.weight": (FFN, D),
        "model.layers.0.mlp.down_proj.weight": (D, FFN),
        "model.layers.0.attn.b_proj.bias": (4,),
        "model.layers.0.attn.b_proj.weight": (4, D),
        **{f"model.layers.0.attn.{n}_proj.weight": (D, D) for n in "qkvo"},
    }
    fla = {name: torch.randn(shape, generator=generator) * 0.3 for name, shape in shapes.items()}
    (tmp_path / "fla").mkdir()
    (tmp_path / "fla" / "config.json").write_text(json.dumps(config))
    save_file(fla, tmp_path / "fla" / "model.safetensors")
    model = load_hf_model(str(tmp_path / "fla")).model
    assert model.model_args.deltaformer_beta == "linear"
    mixer, x = model.layers["0"].mixer, torch.randn(2, 7, D, generator=generator)
    positions = torch.arange(7).expand(2, 7)
    a = "model.layers.0.attn."
    q, k, v = ((x @ fla[a + f"{n}_proj.weight"].T).view(2, 7, 4, 16) for n in "qkv")
    cos, sin = mixer.rope(positions)  # FLA's rotary is the same half-split RoPE with base 10000
    from titan_delta.models.components.rope import apply_rotary

    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    beta = x @ fla[a + "b_proj.weight"].T + fla[a + "b_proj.bias"]
    expected = _fla_naive_deltaformer(q, k, v, beta).reshape(2, 7, D) @ fla[a + "o_proj.weight"].T
    with torch.no_grad():
        torch.testing.assert_close(
            mixer(x, MixerContext(positions=positions)), expected, rtol=1e-4, atol=1e-5
        )
