"""A model's weights out of a training (DCP) checkpoint, for export and evaluation.

One place decides which ``step-N`` folder a path means and refuses torn ones, and rebuilds the model from
the ModelArgs its completion marker records (older checkpoints: from the training TOML's ``[model]``) with
the vocabulary read from the checkpoint itself. DCP reshards on load, so shards
written by any number of ranks load into one CPU process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from titan_delta.models import MODEL_FLAVORS, ModelArgs, TitanDeltaLM
from titan_delta.trainer.checkpoint import COMPLETE_MARKER, is_complete, latest_complete_step


class CheckpointError(ValueError):
    """The checkpoint (or its config) cannot be used; the message names the path or field."""


def resolve_step_dir(path: str, step: int | None = None) -> str:
    """The complete ``step-N`` folder meant by ``path``: a step folder itself, a checkpoint folder holding
    step folders (``step``, else the newest complete one), or a training dump folder holding ``checkpoint/``.
    A folder without its completion marker (a save that was killed) is refused."""
    if not os.path.isdir(path):
        raise CheckpointError(f"--checkpoint {path}: not a folder")
    if os.path.isfile(os.path.join(path, ".metadata")):
        step_dir = path
    else:
        nested = os.path.join(path, "checkpoint")
        if os.path.isdir(nested) and not any(name.startswith("step-") for name in os.listdir(path)):
            path = nested  # a training dump folder
        if step is None:
            step = latest_complete_step(path)
            if step < 0:
                raise CheckpointError(f"--checkpoint {path}: no complete step-N folder inside")
        step_dir = os.path.join(path, f"step-{step}")
    if not is_complete(step_dir):
        raise CheckpointError(
            f"{step_dir}: missing or incomplete checkpoint (no {COMPLETE_MARKER} or .metadata); "
            "pick another step"
        )
    return step_dir


def step_number(step_dir: str) -> int | None:
    name = os.path.basename(os.path.normpath(step_dir))
    return int(name.removeprefix("step-")) if name.startswith("step-") and name[5:].isdigit() else None


def read_training_config(path: str | None, checkpoint: str) -> dict[str, Any]:
    """The training TOML's values; a DCP checkpoint holds weights only, so the config is required."""
    if path is None:
        raise CheckpointError(
            f"--checkpoint {checkpoint} is a DCP checkpoint: pass --config (the training TOML) "
            "to rebuild the model"
        )
    if not os.path.isfile(path):
        raise CheckpointError(f"--config {path}: file not found")
    with open(path, "rb") as f:
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as err:
            raise CheckpointError(f"--config {path}: not valid TOML ({err})") from err


def checkpoint_record(step_dir: str) -> dict[str, Any]:
    """The completion marker's contents (the trainer records ``model_name``, ``flavor``, ``model_args``)."""
    try:
        with open(os.path.join(step_dir, COMPLETE_MARKER)) as f:
            record = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{step_dir}/{COMPLETE_MARKER}: unreadable ({err})") from err
    return record if isinstance(record, dict) else {}


def model_args_from_fields(fields: dict[str, Any], source: str) -> ModelArgs:
    """ModelArgs from recorded fields (a marker's or an export's ``model_args``), validated."""
    known = {f.name for f in dataclasses.fields(ModelArgs)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise CheckpointError(f"{source}: model_args has unknown field(s) {unknown}")
    try:
        return ModelArgs(**fields)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: invalid model_args: {err}") from err


def model_args_for(step_dir: str, config: dict[str, Any], config_path: str) -> ModelArgs:
    """The checkpoint's model: the ModelArgs its marker records (what the trainer resolved, overrides from
    the TOML and the command line included). Checkpoints without that record: the config's ``[model]``
    name/flavor with its field overrides at its training.seq_len. The vocabulary size is the checkpoint's."""
    metadata = dcp.FileSystemReader(step_dir).read_metadata().state_dict_metadata
    if "tok_embeddings.weight" not in metadata:
        raise CheckpointError(f"{step_dir}: no tok_embeddings.weight (not a titan-delta model checkpoint?)")
    vocab_size = int(metadata["tok_embeddings.weight"].size[0])
    recorded = checkpoint_record(step_dir).get("model_args")
    if isinstance(recorded, dict):
        args = model_args_from_fields(recorded, f"{step_dir}/{COMPLETE_MARKER}")
        return dataclasses.replace(args, vocab_size=vocab_size)
    from titan_delta.trainer.config_checks import ConfigError
    from titan_delta.trainer.model_overrides import model_overrides, resolve_model_args

    model_section = config.get("model", {})
    family, flavor = model_section.get("name", "deltaformer"), model_section.get("flavor", "debug")
    if family not in MODEL_FLAVORS:
        raise CheckpointError(
            f"{config_path}: [model] name {family!r}: expected one of {sorted(MODEL_FLAVORS)}"
        )
    if flavor not in MODEL_FLAVORS[family]:
        raise CheckpointError(
            f"{config_path}: [model] flavor {flavor!r}: {family} has {sorted(MODEL_FLAVORS[family])}"
        )
    try:
        args = resolve_model_args(family, flavor, model_overrides(model_section))
    except ConfigError as err:
        raise CheckpointError(f"{config_path}: {err}") from err
    return dataclasses.replace(
        args, vocab_size=vocab_size, max_seq_len=int(config.get("training", {}).get("seq_len", 2048))
    )


def load_model(step_dir: str, args: ModelArgs, config_path: str) -> TitanDeltaLM:
    """A CPU model holding the checkpoint's weights in full (fp32) tensors; tied weights stay tied."""
    metadata = dcp.FileSystemReader(step_dir).read_metadata().state_dict_metadata
    with torch.device("meta"):
        model = TitanDeltaLM(args)
    model.to_empty(device="cpu")
    state = model.state_dict()
    if args.enable_weight_tying:  # the head is the embedding; it may be stored once
        state.pop("output.weight", None)
    missing = sorted(set(state) - set(metadata))
    if missing:
        raise CheckpointError(
            f"{step_dir}: lacks model weights {missing[:5]} (wrong [model] name/flavor/fields?)"
        )
    wrong = [
        f"{k} {tuple(metadata[k].size)} vs {tuple(v.shape)}"
        for k, v in state.items()
        if tuple(getattr(metadata[k], "size", v.shape)) != tuple(v.shape)
    ]
    if wrong:
        raise CheckpointError(
            f"{step_dir}: weight shapes differ from {config_path}'s model (checkpoint vs config): {wrong[:3]}"
        )
    try:
        dcp.load(state, checkpoint_id=step_dir)
    except (OSError, CheckpointException) as err:
        raise CheckpointError(f"{step_dir}: cannot read the model weights ({_first_failure(err)})") from err
    model.load_state_dict(state, strict=not args.enable_weight_tying)
    if args.enable_weight_tying:
        model.output.weight = model.tok_embeddings.weight  # to_empty() untied them
    return model


def _first_failure(err: BaseException) -> str:
    """The underlying error of a DCP failure (a CheckpointException wraps one per rank, with tracebacks)."""
    if isinstance(err, CheckpointException) and err.failures:
        err = next(iter(err.failures.values()))[0]
    return f"{type(err).__name__}: {err}"
