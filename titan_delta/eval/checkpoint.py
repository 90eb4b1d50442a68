"""Rebuild a model and tokenizer for evaluation from an exported checkpoint or a training (DCP) one.

- exported (``tools/export_checkpoint.py``): a folder with ``config.json`` (every ModelArgs field, the
  tokenizer spec, the step) and ``model.safetensors``;
- DCP: a ``step-N`` folder, a folder of them (the newest complete one, or ``step``), or a dump folder
  holding ``checkpoint/``; the model is rebuilt from the training TOML (``[model]`` name/flavor,
  ``training.seq_len``, ``[data]`` tokenizer) and only its weights are read, in any world size's shards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass
from typing import Any

import torch

from titan_delta.data.tokenizer import TiktokenTokenizer, load_tokenizer
from titan_delta.models import MODEL_FLAVORS, ModelArgs, TitanDeltaLM

EXPORTED_FILES = ("config.json", "model.safetensors")


class CheckpointError(ValueError):
    """The checkpoint (or its config) cannot be used; the message names the path or field."""


@dataclass
class LoadedCheckpoint:
    model: TitanDeltaLM
    tokenizer: TiktokenTokenizer
    add_bos: bool  # documents started with BOS in training ([data] add_bos)
    step: int | None
    source: str


def _model_args(fields: dict[str, Any], source: str) -> ModelArgs:
    known = {f.name for f in dataclasses.fields(ModelArgs)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise CheckpointError(f"{source}: model_args has unknown field(s) {unknown}")
    try:
        return ModelArgs(**fields)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: invalid model_args: {err}") from err


def load_exported(folder: str) -> LoadedCheckpoint:
    from safetensors.torch import load_file

    config_path = os.path.join(folder, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    if not isinstance(config.get("model_args"), dict):
        raise CheckpointError(f"{config_path}: expected a 'model_args' object (written by export_checkpoint)")
    model = TitanDeltaLM(_model_args(config["model_args"], config_path))
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
    tokenizer = load_tokenizer(str(config.get("tokenizer", "default")))
    return LoadedCheckpoint(model, tokenizer, bool(config.get("add_bos", False)), config.get("step"), folder)


def resolve_dcp_step(path: str, step: int | None) -> str:
    """The ``step-N`` folder to read, refusing incomplete ones."""
    from titan_delta.trainer.checkpoint import is_complete, latest_complete_step

    if os.path.isfile(os.path.join(path, ".metadata")):
        return path
    if os.path.isdir(os.path.join(path, "checkpoint")) and not any(
        name.startswith("step-") for name in os.listdir(path)
    ):
        path = os.path.join(path, "checkpoint")  # a training dump folder
    if step is None:
        step = latest_complete_step(path)
        if step < 0:
            raise CheckpointError(f"--checkpoint {path}: no complete step-N folder inside")
    step_dir = os.path.join(path, f"step-{step}")
    if not is_complete(step_dir):
        raise CheckpointError(f"{step_dir}: missing or incomplete (no COMPLETE.json/.metadata)")
    return step_dir


def load_dcp(path: str, config_path: str | None, step: int | None = None) -> LoadedCheckpoint:
    import torch.distributed.checkpoint as dcp

    if config_path is None:
        raise CheckpointError(
            f"--checkpoint {path} is a DCP checkpoint: pass --config (the training TOML) to rebuild the model"
        )
    if not os.path.isfile(config_path):
        raise CheckpointError(f"--config {config_path}: file not found")
    with open(config_path, "rb") as f:
        values = tomllib.load(f)
    step_dir = resolve_dcp_step(path, step)
    model_section, data = values.get("model", {}), values.get("data", {})
    family, flavor = model_section.get("name", "deltaformer"), model_section.get("flavor", "debug")
    if family not in MODEL_FLAVORS or flavor not in MODEL_FLAVORS[family]:
        raise CheckpointError(f"{config_path}: [model] name={family!r} flavor={flavor!r} is not registered")
    metadata = dcp.FileSystemReader(step_dir).read_metadata().state_dict_metadata
    if "tok_embeddings.weight" not in metadata:
        raise CheckpointError(f"{step_dir}: no tok_embeddings.weight (not a titan-delta model checkpoint?)")
    args = dataclasses.replace(
        MODEL_FLAVORS[family][flavor],
        vocab_size=int(metadata["tok_embeddings.weight"].size[0]),
        max_seq_len=int(values.get("training", {}).get("seq_len", 2048)),
    )
    with torch.device("meta"):
        model = TitanDeltaLM(args)
    model.to_empty(device="cpu")
    state = model.state_dict()
    missing = sorted(set(state) - set(metadata))
    if args.enable_weight_tying:  # the head is the embedding; it may be stored once
        missing = [k for k in missing if k != "output.weight"]
        state.pop("output.weight", None)
    if missing:
        raise CheckpointError(f"{step_dir}: lacks model weights {missing[:5]} (wrong [model] name/flavor?)")
    wrong = [
        f"{k} {tuple(metadata[k].size)} vs {tuple(v.shape)}"
        for k, v in state.items()
        if tuple(getattr(metadata[k], "size", v.shape)) != tuple(v.shape)
    ]
    if wrong:
        raise CheckpointError(
            f"{step_dir}: weight shapes differ from {config_path}'s model (checkpoint vs config): {wrong[:3]}"
        )
    dcp.load(state, checkpoint_id=step_dir)
    model.load_state_dict(state, strict=not args.enable_weight_tying)
    if args.enable_weight_tying:
        model.output.weight = model.tok_embeddings.weight  # to_empty() untied them
    tokenizer = load_tokenizer(str(data.get("tokenizer", "default")), str(data.get("tokenizer_pattern", "")))
    step_number = int(os.path.basename(step_dir).removeprefix("step-"))
    return LoadedCheckpoint(model, tokenizer, bool(data.get("add_bos", False)), step_number, step_dir)


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
