"""Convert a training checkpoint (DCP folder) into one ``model.safetensors`` + ``config.json``.

    python tools/export_checkpoint.py --checkpoint outputs/run/checkpoint [--step N] \
        --config train_configs/deltaformer_340M.toml --out exports/run [--dtype bfloat16]

``--checkpoint`` is either a ``step-N`` folder or the folder holding them (then the newest *complete*
one, or ``--step N``). No process group is needed: DCP reads the shards of any world size into full
tensors on the CPU. Only the model's weights are read; optimizer and loader state are ignored.
``config.json`` holds the model family/flavor, every ModelArgs field (vocab size taken from the
checkpoint), the tokenizer spec and the source step, which is all an eval harness needs to rebuild it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tomllib
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from titan_delta.models import MODEL_FLAVORS, TitanDeltaLM
from titan_delta.trainer.checkpoint import COMPLETE_MARKER, is_complete, latest_complete_step

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ExportError(ValueError):
    """Bad input to the exporter; the message names the argument or file."""


def resolve_step_dir(checkpoint: str, step: int | None) -> str:
    """The ``step-N`` folder to export; refuses folders without a completion marker."""
    if not os.path.isdir(checkpoint):
        raise ExportError(f"--checkpoint {checkpoint}: not a folder")
    if os.path.isfile(os.path.join(checkpoint, ".metadata")):
        path = checkpoint
    else:
        if step is None:
            step = latest_complete_step(checkpoint)
            if step < 0:
                raise ExportError(f"--checkpoint {checkpoint}: no complete step-N folder inside")
        path = os.path.join(checkpoint, f"step-{step}")
    if not is_complete(path):
        raise ExportError(
            f"{path}: incomplete checkpoint (no {COMPLETE_MARKER} or .metadata); pick another step"
        )
    return path


def read_training_config(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ExportError(f"--config {path}: file not found")
    with open(path, "rb") as f:
        return tomllib.load(f)


def model_args_for(family: str, flavor: str, seq_len: int, vocab_size: int) -> Any:
    if family not in MODEL_FLAVORS:
        raise ExportError(f"model name {family!r}: expected one of {sorted(MODEL_FLAVORS)}")
    if flavor not in MODEL_FLAVORS[family]:
        raise ExportError(f"model flavor {flavor!r}: {family} has {sorted(MODEL_FLAVORS[family])}")
    return dataclasses.replace(MODEL_FLAVORS[family][flavor], vocab_size=vocab_size, max_seq_len=seq_len)


def load_model_state(step_dir: str, args: Any) -> dict[str, torch.Tensor]:
    """Full fp32 tensors of every model parameter, read from the DCP shards."""
    with torch.device("meta"):
        model = TitanDeltaLM(args)
    model.to_empty(device="cpu")
    state = {k: v for k, v in model.state_dict(keep_vars=False).items()}
    missing = sorted(set(state) - set(dcp.FileSystemReader(step_dir).read_metadata().state_dict_metadata))
    if missing:
        raise ExportError(
            f"{step_dir}: checkpoint lacks model weights {missing[:5]} (wrong model name/flavor?)"
        )
    dcp.load(state, checkpoint_id=step_dir)
    return state


def export(checkpoint: str, config: str, out: str, step: int | None = None, dtype: str = "float32") -> str:
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype}: expected one of {sorted(DTYPES)}")
    step_dir = resolve_step_dir(checkpoint, step)
    values = read_training_config(config)
    model_section, training = values.get("model", {}), values.get("training", {})
    family, flavor = model_section.get("name", "deltaformer"), model_section.get("flavor", "debug")
    metadata = dcp.FileSystemReader(step_dir).read_metadata().state_dict_metadata
    if "tok_embeddings.weight" not in metadata:
        raise ExportError(
            f"{step_dir}: no tok_embeddings.weight in the checkpoint (not a titan-delta model?)"
        )
    vocab_size = int(metadata["tok_embeddings.weight"].size[0])
    args = model_args_for(family, flavor, int(training.get("seq_len", 2048)), vocab_size)
    state = load_model_state(step_dir, args)
    if args.enable_weight_tying:
        state.pop("output.weight", None)  # safetensors refuses shared storage; config.json records the tie
    tensors = {k: v.to(DTYPES[dtype]).contiguous() for k, v in state.items()}
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(step_dir, COMPLETE_MARKER)) as f:
        marker = json.load(f)
    description = {
        "model_name": family,
        "flavor": flavor,
        "model_args": {k: v for k, v in dataclasses.asdict(args).items() if not k.startswith("_")},
        "dtype": dtype,
        "tokenizer": values.get("data", {}).get("tokenizer", "default"),
        "source_checkpoint": os.path.abspath(step_dir),
        "step": marker.get("step"),
        "num_parameters": sum(t.numel() for t in tensors.values()),
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(description, f, indent=2, default=str)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, help="a step-N folder or the folder holding them")
    parser.add_argument("--config", required=True, help="the training TOML ([model] name/flavor, seq_len)")
    parser.add_argument("--out", required=True, help="output folder for model.safetensors + config.json")
    parser.add_argument("--step", type=int, default=None, help="step to export (default: latest complete)")
    parser.add_argument("--dtype", default="float32", help=f"one of {sorted(DTYPES)}")
    args = parser.parse_args(argv)
    try:
        out = export(args.checkpoint, args.config, args.out, args.step, args.dtype)
    except ExportError as err:
        print(f"export_checkpoint: {err}", file=sys.stderr)
        return 2
    print(f"exported to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
