"""Convert a training checkpoint (DCP folder) into ``model.safetensors`` + ``config.json``, a folder that
titan-delta's eval reads and that also loads with stock Hugging Face transformers (docs/hf.md).

    python tools/export_checkpoint.py --checkpoint outputs/run/checkpoint [--step N] \
        --config train_configs/deltaformer_340M.toml --out exports/run [--dtype bfloat16]

``--checkpoint`` is a ``step-N`` folder, the folder holding them (then the newest *complete* one, or
``--step N``), or a training dump folder holding ``checkpoint/``. No process group is needed: DCP reads
the shards of any world size into full tensors on the CPU. Only the model's weights are read; optimizer
and loader state are ignored.
The model is the one the checkpoint's completion marker records (family, flavor and every resolved
ModelArgs field, ``[model]`` overrides given in the TOML or on the command line included); for checkpoints
without that record it is the ``--config`` TOML's ``[model]`` name/flavor with its field overrides.
``config.json`` holds the model family/flavor, every ModelArgs field (vocab size taken from the
checkpoint), the tokenizer spec, whether documents began with BOS, and the source step, which is all an
eval harness needs to rebuild it; its Hugging Face keys, the two remote-code files, the tokenizer
converted to ``tokenizer.json`` and ``generation_config.json`` make the folder loadable with
``AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)`` and ``AutoTokenizer``.
"""

from __future__ import annotations

import argparse
import os
import sys

from titan_delta.hf.export_folder import DTYPES, export_tensors, model_args_dict, write_export
from titan_delta.trainer.dcp_model import (
    CheckpointError,
    checkpoint_record,
    load_model,
    model_args_for,
    read_training_config,
    resolve_step_dir,
)

ExportError = CheckpointError  # one error type for every unusable checkpoint, config or argument

__all__ = ["DTYPES", "ExportError", "export", "main", "resolve_step_dir"]


def export(checkpoint: str, config: str, out: str, step: int | None = None, dtype: str = "float32") -> str:
    """Write the export folder ``out`` (``model.safetensors``, ``config.json`` and the Hugging Face files);
    returns ``out``."""
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype}: expected one of {sorted(DTYPES)}")
    step_dir = resolve_step_dir(checkpoint, step)
    values = read_training_config(config, checkpoint)
    args = model_args_for(step_dir, values, config)
    tensors = export_tensors(load_model(step_dir, args, config).state_dict(), args, dtype)
    marker = checkpoint_record(step_dir)
    model_section, data = values.get("model", {}), values.get("data", {})
    description = {
        "model_name": marker.get("model_name", model_section.get("name", "deltaformer")),
        "flavor": marker.get("flavor", model_section.get("flavor", "debug")),
        "model_args": model_args_dict(args),
        "dtype": dtype,
        "tokenizer": data.get("tokenizer", "default"),
        "tokenizer_pattern": data.get("tokenizer_pattern", ""),
        "add_bos": bool(data.get("add_bos", False)),  # evaluation must frame documents as training did
        **{key: data[key] for key in ("eos_token", "bos_token") if data.get(key)},  # HF tokenizer choices
        "source_checkpoint": os.path.abspath(step_dir),
        "step": marker.get("step"),
        "num_parameters": sum(t.numel() for t in tensors.values()),
    }
    try:
        notes = write_export(out, tensors, description)
    except OSError as err:
        raise ExportError(f"--out {out}: cannot write the export ({err})") from err
    for note in notes:
        print(f"export_checkpoint: {note}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--checkpoint", required=True, help="a step-N folder, the folder holding them, or a dump folder"
    )
    parser.add_argument(
        "--config",
        required=True,
        help="the training TOML ([data] tokenizer; [model] for checkpoints that do not record their model)",
    )
    parser.add_argument(
        "--out", required=True, help="output folder (model.safetensors, config.json, Hugging Face files)"
    )
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
