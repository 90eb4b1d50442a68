"""Write model weights as a model-only DCP ``step-N`` folder, like ``--checkpoint.create_seed_checkpoint``.

The trainer starts from it with ``--checkpoint.enable --checkpoint.initial_load_path DIR/step-0``:
torchtitan loads the model's state dict (names as ``TitanDeltaLM.state_dict()``) from it, resharding to
any parallel layout. The folder is marked complete the way ``MarkedCheckpointManager`` marks its own saves
(``COMPLETE.json`` with the file list, ``resumable = false``: there is no optimizer or loader state to
resume, so ``--checkpoint.folder`` logic never mistakes it for a run to continue).

Also: how the trainer builds a given ``ModelArgs``: a registered ``[model] name`` / ``flavor`` plus the
``[model]`` field overrides that turn it into these args (the vocabulary comes from the tokenizer, the
length from the config).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from titan_delta.models import MODEL_FLAVORS, ModelArgs
from titan_delta.trainer.checkpoint import mark_complete, saved_files, unmark


def write_seed_checkpoint(state: dict[str, torch.Tensor], folder: str, step: int = 0) -> str:
    """``folder/step-{step}`` holding ``state`` (fp32, contiguous) as a complete model-only checkpoint."""
    path = os.path.join(folder, f"step-{step}")
    if os.path.isdir(path):
        unmark(path)  # a half-rewritten folder must never count as complete
        shutil.rmtree(path)
    os.makedirs(path)
    tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}
    # No process group: DCP writes a single-process checkpoint that any world size can load.
    dcp.save(tensors, checkpoint_id=path, no_dist=True)
    mark_complete(path, step, {"world_size": 1, "resumable": False, "files": saved_files(path)})
    return path


ATTENTION_FIELDS = ("n_heads", "kv_heads", "attn_head_dim", "qk_norm", "rope_theta")
DELTAFORMER_FIELDS = ("deltaformer_kernel", "deltaformer_probe", "deltaformer_beta", "deltaformer_rope")
GDP_FIELDS = (
    "gdp_heads", "gdp_key_dim", "gdp_value_dim", "gdp_num_householder", "gdp_allow_neg_eigval",
    "gdp_forget_gate", "gdp_short_conv", "gdp_output_gate",
)  # fmt: skip


def _signature(args: ModelArgs) -> dict[str, Any]:
    """The fields that decide the weights and the function of a model with ``args``' mixers (sizes the
    trainer sets itself — vocabulary, context length — and backends excluded)."""
    used = set(args.layer_mixers())
    names = ["dim", "ffn_dim", "norm_eps", "enable_weight_tying"]
    if used & {"attention", "swa", "deltaformer"}:
        names += ATTENTION_FIELDS
    if used & {"attention", "swa"}:
        names.append("attn_rope")
    if "swa" in used:
        names.append("window_size")
    if "deltaformer" in used:
        names += DELTAFORMER_FIELDS
    if "gated_deltaproduct" in used:
        names += GDP_FIELDS + (("gdp_conv_size",) if args.gdp_short_conv else ())
    return {"mixers": args.layer_mixers(), **{name: getattr(args, name) for name in names}}


def matching_flavor(args: ModelArgs) -> tuple[str, str] | None:
    """The registered (family, flavor) whose models have exactly ``args``' weights and function, if any."""
    wanted = _signature(args)
    for family, flavors in MODEL_FLAVORS.items():
        for flavor, candidate in flavors.items():
            if _signature(candidate) == wanted:
                return family, flavor
    return None


SET_BY_THE_RUN = ("vocab_size", "max_seq_len")  # the tokenizer's and [training] seq_len, not [model] keys


def flavor_with_overrides(args: ModelArgs) -> tuple[str, str, dict[str, Any]] | None:
    """(family, flavor, ``[model]`` field overrides) that rebuild ``args``' weights and function, with as
    few overrides as possible; None if no flavor gets there (a field the overrides cannot reach)."""
    from dataclasses import fields, replace

    wanted = _signature(args)
    best = None
    for family, flavors in MODEL_FLAVORS.items():
        for flavor, candidate in flavors.items():
            overrides = {
                f.name: getattr(args, f.name)
                for f in fields(ModelArgs)
                if not f.name.startswith("_")
                and f.name not in SET_BY_THE_RUN
                and getattr(args, f.name) != getattr(candidate, f.name)
            }
            try:
                rebuilt = replace(candidate, **overrides)
            except (ValueError, TypeError, AssertionError):
                continue
            if _signature(rebuilt) == wanted and (best is None or len(overrides) < len(best[2])):
                best = (family, flavor, overrides)
    return best
