"""Rebuild a model and tokenizer for evaluation from an exported checkpoint or a training (DCP) one.

- exported (``tools/export_checkpoint.py``): a folder with ``config.json`` (every ModelArgs field, the
  tokenizer spec, the step) and ``model.safetensors``;
- DCP: a ``step-N`` folder, a folder of them (the newest complete one, or ``step``), or a dump folder
  holding ``checkpoint/``; the model is rebuilt from the ModelArgs the checkpoint's marker records
  (checkpoints without them: the training TOML's ``[model]`` name/flavor/field overrides and
  ``training.seq_len``), the tokenizer from the TOML's ``[data]``; only its weights are read, in any world
  size's shards.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from titan_delta.data.tokenizer import DataTokenizer, load_tokenizer
from titan_delta.models import TitanDeltaLM
from titan_delta.trainer.dcp_model import (
    CheckpointError,
    load_model,
    model_args_for,
    model_args_from_fields,
    read_training_config,
    resolve_step_dir,
    step_number,
)

EXPORTED_FILES = ("config.json", "model.safetensors")


@dataclass
class LoadedCheckpoint:
    model: TitanDeltaLM
    tokenizer: DataTokenizer
    add_bos: bool  # documents started with BOS in training ([data] add_bos)
    step: int | None
    source: str


def _tokenizer(settings: dict[str, Any]) -> DataTokenizer:
    """The tokenizer of a training ``[data]`` section or an export's config.json (same keys)."""
    keys = ("tokenizer_pattern", "eos_token", "bos_token")
    pattern, eos, bos = (str(settings.get(key) or "") for key in keys)
    return load_tokenizer(str(settings.get("tokenizer", "default")), pattern, 2, eos, bos)


def load_exported(folder: str) -> LoadedCheckpoint:
    from safetensors.torch import load_file

    config_path = os.path.join(folder, "config.json")
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{config_path}: unreadable ({err}); expected export_checkpoint JSON") from err
    if not isinstance(config.get("model_args"), dict):
        raise CheckpointError(f"{config_path}: expected a 'model_args' object (written by export_checkpoint)")
    model = TitanDeltaLM(model_args_from_fields(config["model_args"], config_path))
    state = load_file(os.path.join(folder, "model.safetensors"))
    missing, unexpected = model.load_state_dict(
        {k: v.to(torch.float32) for k, v in state.items()}, strict=False
    )
    if model.model_args.enable_weight_tying:
        missing = [k for k in missing if k != "output.weight"]  # the exporter drops the tied copy
    if missing or unexpected:
        raise CheckpointError(
            f"{folder}/model.safetensors does not match config.json: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    tokenizer = _tokenizer(config)
    return LoadedCheckpoint(model, tokenizer, bool(config.get("add_bos", False)), config.get("step"), folder)


def load_dcp(path: str, config_path: str | None, step: int | None = None) -> LoadedCheckpoint:
    """Weights from a complete DCP step folder, the model and tokenizer from the training TOML."""
    values = read_training_config(config_path, path)
    step_dir = resolve_step_dir(path, step)
    model = load_model(step_dir, model_args_for(step_dir, values, str(config_path)), str(config_path))
    data = values.get("data", {})
    tokenizer = _tokenizer(data)
    add_bos = bool(data.get("add_bos", False))
    return LoadedCheckpoint(model, tokenizer, add_bos, step_number(step_dir), step_dir)


def load_checkpoint(path: str, config_path: str | None = None, step: int | None = None) -> LoadedCheckpoint:
    """Exported folder or DCP checkpoint → fp32 model on the CPU (move/cast it afterwards), in eval mode."""
    if not os.path.isdir(path):
        raise CheckpointError(f"--checkpoint {path}: not a folder")
    if all(os.path.isfile(os.path.join(path, name)) for name in EXPORTED_FILES):
        loaded = load_exported(path)
    else:
        loaded = load_dcp(path, config_path, step)
    loaded.model.eval()
    return loaded
