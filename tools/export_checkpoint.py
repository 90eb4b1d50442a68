"""Convert a training checkpoint (DCP folder) into one ``model.safetensors`` + ``config.json``.

    python tools/export_checkpoint.py --checkpoint outputs/run/checkpoint [--step N] \
        --config train_configs/deltaformer_340M.toml --out exports/run [--dtype bfloat16]

``--checkpoint`` is a ``step-N`` folder, the folder holding them (then the newest *complete* one, or
``--step N``), or a training dump folder holding ``checkpoint/``. No process group is needed: DCP reads
the shards of any world size into full tensors on the CPU. Only the model's weights are read; optimizer
and loader state are ignored.
``config.json`` holds the model family/flavor, every ModelArgs field (vocab size taken from the
checkpoint), the tokenizer spec, whether documents began with BOS, and the source step, which is all an
eval harness needs to rebuild it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch
from safetensors.torch import save_file

from titan_delta.trainer.checkpoint import COMPLETE_MARKER
from titan_delta.trainer.dcp_model import (
    CheckpointError,
    load_model,
    model_args_for,
    read_training_config,
    resolve_step_dir,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ExportError = CheckpointError  # one error type for every unusable checkpoint, config or argument

__all__ = ["DTYPES", "ExportError", "export", "main", "resolve_step_dir"]


def export(checkpoint: str, config: str, out: str, step: int | None = None, dtype: str = "float32") -> str:
    """Write ``out/model.safetensors`` and ``out/config.json``; returns ``out``."""
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype}: expected one of {sorted(DTYPES)}")
    step_dir = resolve_step_dir(checkpoint, step)
    values = read_training_config(config, checkpoint)
    args = model_args_for(step_dir, values, config)
    state = load_model(step_dir, args, config).state_dict()
    if args.enable_weight_tying:
        state.pop("output.weight", None)  # safetensors refuses shared storage; config.json records the tie
    tensors = {k: v.to(DTYPES[dtype]).contiguous() for k, v in state.items()}
    try:
        os.makedirs(out, exist_ok=True)
        save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    except OSError as err:
        raise ExportError(f"--out {out}: cannot write the export ({err})") from err
    with open(os.path.join(step_dir, COMPLETE_MARKER)) as f:
        marker = json.load(f)
    model_section, data = values.get("model", {}), values.get("data", {})
    description = {
        "model_name": model_section.get("name", "deltaformer"),
        "flavor": model_section.get("flavor", "debug"),
        "model_args": {k: v for k, v in dataclasses.asdict(args).items() if not k.startswith("_")},
        "dtype": dtype,
        "tokenizer": data.get("tokenizer", "default"),
        "tokenizer_pattern": data.get("tokenizer_pattern", ""),
        "add_bos": bool(data.get("add_bos", False)),  # evaluation must frame documents as training did
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
    parser.add_argument(
        "--checkpoint", required=True, help="a step-N folder, the folder holding them, or a dump folder"
    )
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
