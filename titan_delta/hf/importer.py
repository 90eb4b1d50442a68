"""Import a Hugging Face folder as a DCP checkpoint to continue pretraining from.

Sources: titan-delta's own exports (``model_type = "titan_delta"``, or an older export whose config.json
has ``model_args`` only) and flash-linear-attention's Gated DeltaProduct / DeltaFormer checkpoints
(``titan_delta.hf.fla_mapping``). The weights are loaded into a ``TitanDeltaLM`` first (strict: every
parameter present, every shape right), so a folder that imports is one the trainer can load, and then
written as ``OUT/step-0`` (``titan_delta.hf.seed_checkpoint``) with ``OUT/import.json`` describing it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from titan_delta.hf.export_folder import model_args_dict
from titan_delta.hf.fla_mapping import FLA_MODEL_TYPES, fla_model_args, fla_state_dict
from titan_delta.hf.hf_folder import read_config, read_weights
from titan_delta.hf.seed_checkpoint import flavor_with_overrides, matching_flavor, write_seed_checkpoint
from titan_delta.models import ModelArgs, TitanDeltaLM

IMPORT_DESCRIPTION = "import.json"


class HFImportError(ValueError):
    """The folder cannot be imported; the message names the file, field or tensor."""


@dataclass
class ImportedCheckpoint:
    model: TitanDeltaLM  # the imported weights, on the CPU in fp32
    source_format: str  # "titan_delta" or FLA's model_type
    step_dir: str | None  # OUT/step-0, once written
    family_flavor: tuple[str, str] | None  # the registered [model] name/flavor with these weights
    config: dict[str, Any]  # the source config.json


def _titan_delta_model(config: dict[str, Any], state: dict[str, torch.Tensor]) -> tuple[ModelArgs, dict]:
    try:
        args = ModelArgs(**config["model_args"])
    except (TypeError, ValueError) as err:
        raise HFImportError(f"config.json model_args: {err}") from err
    # save_pretrained of a wrapper with a prefix, or a hand-made folder, may add "model."
    state = {k.removeprefix("model."): v for k, v in state.items()}
    return args, state


def load_hf_model(folder: str) -> ImportedCheckpoint:
    """The model a Hugging Face folder holds, as a ``TitanDeltaLM`` (fp32, CPU, eval mode)."""
    config = read_config(folder)
    model_type = config.get("model_type")
    state = read_weights(folder)
    if model_type == "titan_delta" or (model_type is None and isinstance(config.get("model_args"), dict)):
        source = "titan_delta"
        args, state = _titan_delta_model(config, state)
    elif model_type in FLA_MODEL_TYPES:
        source = str(model_type)
        args = fla_model_args(config)
        state = fla_state_dict(state, args)
    else:
        raise HFImportError(
            f"{folder}/config.json: model_type {model_type!r} is not importable; expected 'titan_delta' "
            f"(tools/export_checkpoint.py) or one of flash-linear-attention's {FLA_MODEL_TYPES}"
        )
    model = TitanDeltaLM(args)
    if args.enable_weight_tying:
        state = {k: v for k, v in state.items() if k != "output.weight"}  # it is the embedding
    expected = model.state_dict()
    if args.enable_weight_tying:
        expected.pop("output.weight")
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
             if k in state and state[k].shape != v.shape]  # fmt: skip
    if missing or unexpected or wrong:
        raise HFImportError(
            f"{folder}: weights do not match the model its config describes: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, shapes (file vs model) {wrong[:3]}"
        )
    model.load_state_dict(
        {k: v.to(torch.float32) for k, v in state.items()}, strict=not args.enable_weight_tying
    )
    return ImportedCheckpoint(model.eval(), source, None, matching_flavor(args), config)


def import_checkpoint(folder: str, out: str, step: int = 0) -> ImportedCheckpoint:
    """Write ``out/step-{step}`` (model-only DCP, complete) and ``out/import.json``."""
    imported = load_hf_model(folder)
    state = imported.model.state_dict()  # both tied names: the trainer may ask for either
    imported.step_dir = write_seed_checkpoint(state, out, step)
    args = imported.model.model_args
    description = {
        "source": os.path.abspath(folder),
        "source_format": imported.source_format,
        "step_dir": imported.step_dir,
        "model_args": model_args_dict(args),
        "trainer": trainer_settings(imported),
    }
    with open(os.path.join(out, IMPORT_DESCRIPTION), "w") as f:
        json.dump(description, f, indent=2, default=str)
    return imported


def trainer_settings(imported: ImportedCheckpoint) -> dict[str, Any]:
    """What a training config needs to continue from the import, or why the trainer cannot build it."""
    args = imported.model.model_args
    settings: dict[str, Any] = {"vocab_size": args.vocab_size}
    built = flavor_with_overrides(args)
    if built is None:
        settings["problem"] = (
            "no registered [model] name/flavor with [model] field overrides builds these layers; see "
            "MODEL_FLAVORS in titan_delta/models/flavors.py"
        )
    else:
        family, flavor, overrides = built
        settings["model.name"], settings["model.flavor"] = family, flavor
        settings |= {f"model.{key}": value for key, value in overrides.items()}
    if imported.source_format == "titan_delta":
        for key in ("tokenizer", "tokenizer_pattern", "add_bos", "eos_token", "bos_token"):
            if imported.config.get(key) not in (None, ""):
                settings[f"data.{key}"] = imported.config[key]
    return settings
