"""Write an export folder: titan-delta's ``model.safetensors`` + ``config.json``, which are at the same time
a Hugging Face model folder (``AutoModelForCausalLM`` with ``trust_remote_code=True``, ``AutoTokenizer``).

- ``config.json``: titan-delta's description (``model_name``, ``flavor``, ``model_args``, ``tokenizer``,
  ``tokenizer_pattern``, ``add_bos``, ``step``, ...; what ``titan_delta.eval`` reads) plus the Hugging Face
  keys: ``model_type``, ``architectures``, ``auto_map`` (pointing at the two code files below), the
  standard size fields and the special-token ids.
- ``configuration_titan_delta.py``, ``modeling_titan_delta.py``: copied from ``titan_delta.hf``.
- ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``: the training tokenizer
  converted from tiktoken (``titan_delta.hf.tokenizer_files``), and ``generation_config.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from titan_delta.data.config import DataConfigError
from titan_delta.data.tokenizer import DataTokenizer, load_tokenizer
from titan_delta.hf.tokenizer_files import special_ids, special_tokens_map, write_tokenizer_files
from titan_delta.models import ModelArgs

HF_DIR = Path(__file__).resolve().parent
CODE_FILES = ("configuration_titan_delta.py", "modeling_titan_delta.py")
MODEL_TYPE = "titan_delta"
ARCHITECTURE = "TitanDeltaForCausalLM"
AUTO_MAP = {
    "AutoConfig": "configuration_titan_delta.TitanDeltaConfig",
    "AutoModel": "modeling_titan_delta.TitanDeltaForCausalLM",
    "AutoModelForCausalLM": "modeling_titan_delta.TitanDeltaForCausalLM",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_args_dict(args: ModelArgs) -> dict[str, Any]:
    """Every ModelArgs field as JSON-able values (what ``config.json``'s ``model_args`` holds)."""
    fields = {k: v for k, v in dataclasses.asdict(args).items() if not k.startswith("_")}
    if isinstance(fields.get("layer_pattern"), tuple):
        fields["layer_pattern"] = list(fields["layer_pattern"])
    return fields


def export_tensors(state: dict[str, torch.Tensor], args: ModelArgs, dtype: str) -> dict[str, torch.Tensor]:
    """The state dict as safetensors wants it: one dtype, contiguous, the tied LM head left out (safetensors
    refuses shared storage; ``config.json`` records the tie)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype}: expected one of {sorted(DTYPES)}")
    if args.enable_weight_tying:
        state = {k: v for k, v in state.items() if k != "output.weight"}
    return {k: v.detach().to(DTYPES[dtype]).contiguous() for k, v in state.items()}


def hf_fields(description: dict[str, Any], tokenizer: DataTokenizer | None) -> dict[str, Any]:
    """The Hugging Face keys of ``config.json`` for titan-delta's ``description``."""
    args = description["model_args"]
    fields: dict[str, Any] = {
        "model_type": MODEL_TYPE,
        "architectures": [ARCHITECTURE],
        "auto_map": AUTO_MAP,
        "vocab_size": args["vocab_size"],
        "hidden_size": args["dim"],
        "num_hidden_layers": args["n_layers"],
        "max_position_embeddings": args["max_seq_len"],
        "tie_word_embeddings": bool(args.get("enable_weight_tying", False)),
        "use_cache": True,
    }
    if tokenizer is not None:
        specials = special_tokens_map(tokenizer, bool(description.get("add_bos", False)))
        ids = special_ids(tokenizer)
        fields.update({f"{name}_id": ids[token] for name, token in specials.items()})
    return fields


def write_export(out: str, tensors: dict[str, torch.Tensor], description: dict[str, Any]) -> list[str]:
    """Write the whole folder (see the module docstring); returns notes for the user (what was skipped).

    ``description`` is titan-delta's config (``model_args``, ``tokenizer``, ``tokenizer_pattern``,
    ``add_bos``, ...); ``tensors`` come from ``export_tensors``. Raises OSError when ``out`` is unwritable."""
    os.makedirs(out, exist_ok=True)
    notes: list[str] = []
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    add_bos = bool(description.get("add_bos", False))
    # EOS/BOS choices of a Hugging Face training tokenizer ([data] eos_token / bos_token), when recorded
    chosen = {key: str(description[key]) for key in ("eos_token", "bos_token") if description.get(key)}
    try:
        spec, pattern = (
            str(description.get("tokenizer", "default")),
            str(description.get("tokenizer_pattern", "")),
        )
        tokenizer: DataTokenizer | None = load_tokenizer(spec, pattern, **chosen)
        write_tokenizer_files(out, tokenizer, add_bos, int(description["model_args"]["max_seq_len"]))
    except (DataConfigError, ValueError, KeyError, AttributeError) as err:
        tokenizer = None
        notes.append(f"no Hugging Face tokenizer files written ({type(err).__name__}: {err})")
    config = {**description, **hf_fields(description, tokenizer)}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, default=str)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)
    for name in CODE_FILES:
        shutil.copyfile(HF_DIR / name, os.path.join(out, name))
    return notes


def export_model(
    model: torch.nn.Module, out: str, *, dtype: str = "float32", **description: Any
) -> list[str]:
    """Export an in-memory ``TitanDeltaLM`` (e.g. one just built or trained in Python). ``description``
    adds or overrides titan-delta's config keys (``model_name``, ``flavor``, ``tokenizer``, ``add_bos``,
    ``step``, ...)."""
    args: ModelArgs = model.model_args  # type: ignore[assignment]
    tensors = export_tensors(model.state_dict(), args, dtype)
    full = {
        "model_name": "custom",
        "flavor": "custom",
        "model_args": model_args_dict(args),
        "dtype": dtype,
        "tokenizer": "default",
        "tokenizer_pattern": "",
        "add_bos": False,
        "num_parameters": sum(t.numel() for t in tensors.values()),
        **description,
    }
    return write_export(out, tensors, full)
