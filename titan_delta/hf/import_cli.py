"""Convert a Hugging Face folder into a DCP checkpoint to continue pretraining from.

    python tools/import_checkpoint.py --hf exports/run --out imports/run
    python -m titan_delta.train --job.config_file train_configs/deltaformer_340M.toml \
        --checkpoint.enable --checkpoint.initial_load_path imports/run/step-0

``--hf`` is a titan-delta export (tools/export_checkpoint.py, or a ``save_pretrained`` of one) or a
flash-linear-attention Gated DeltaProduct / DeltaFormer checkpoint (config.json + safetensors or .bin).
``--out/step-0`` is a complete, model-only DCP checkpoint; ``--out/import.json`` records the ModelArgs and
the ``[model]`` / ``[data]`` settings the training config needs (or why no registered flavor fits).
Limits and the FLA differences: docs/hf.md.
"""

from __future__ import annotations

import argparse
import sys

from titan_delta.hf.fla_mapping import FLAMappingError
from titan_delta.hf.hf_folder import HFFolderError
from titan_delta.hf.importer import HFImportError, import_checkpoint, trainer_settings

ImportFailure = (HFImportError, HFFolderError, FLAMappingError)

__all__ = ["ImportFailure", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hf", required=True, help="Hugging Face model folder (config.json + weights)")
    parser.add_argument("--out", required=True, help="output folder: step-N/ (DCP) and import.json")
    parser.add_argument("--step", type=int, default=0, help="step number of the written folder (default 0)")
    args = parser.parse_args(argv)
    try:
        imported = import_checkpoint(args.hf, args.out, args.step)
    except ImportFailure as err:
        print(f"import_checkpoint: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"import_checkpoint: --out {args.out}: cannot write ({err})", file=sys.stderr)
        return 2
    print(f"imported {imported.source_format} checkpoint to {imported.step_dir}")
    settings = trainer_settings(imported)
    if "problem" in settings:
        print(f"{settings['problem']} (import.json has the model's fields)", file=sys.stderr)
        return 0
    model_keys = {key: value for key, value in settings.items() if key.startswith("model.")}
    flags = " ".join(f"--{key} {_cli_value(value)}" for key, value in model_keys.items())
    print(
        f"train with {flags} --checkpoint.enable --checkpoint.initial_load_path {imported.step_dir} "
        f"(and a tokenizer of {settings['vocab_size']} tokens)"
    )
    return 0


def _cli_value(value: object) -> str:
    """A ModelArgs value as its ``--model.<field>`` flag takes it."""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
