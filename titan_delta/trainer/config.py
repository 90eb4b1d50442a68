"""titan-delta's config sections, merged into torchtitan's JobConfig via ``--job.custom_config_module``.

torchtitan merges this module's ``JobConfig`` field by field: a section present in both (``optimizer``,
``metrics``, ``checkpoint``, ...) gains our keys and our defaults; new sections (``nan_policy``,
``data``, ``eval``) are added. ``python -m titan_delta.train`` selects this module automatically.
``[model]`` also takes every ModelArgs field under its own name, replacing the flavor's value
(:mod:`titan_delta.trainer.model_overrides`).
"""

# No ``from __future__ import annotations`` here: torchtitan merges sections by checking that each
# field's *type object* is a dataclass, and postponed (string) annotations would defeat that check.
import typing
from dataclasses import dataclass, field, fields, make_dataclass

import tyro

from titan_delta.data.config import DataConfig
from titan_delta.eval.config import EvalConfig
from titan_delta.models.args import ModelArgs

CUSTOM_CONFIG_MODULE = "titan_delta.trainer.config"

# Parameter names (substrings of the FQN) that never get weight decay, besides every parameter with
# fewer than two dims: decaying gates, decay rates or norm scales toward zero changes what the layer
# computes rather than regularising it.
DEFAULT_NO_WEIGHT_DECAY = ["A_log", "dt_bias", "bias", "norm"]


@dataclass
class Job:
    custom_config_module: str = CUSTOM_CONFIG_MODULE
    """Module whose JobConfig extends torchtitan's (set automatically by python -m titan_delta.train)"""


@dataclass
class _ModelChoice:
    name: str = "deltaformer"
    """Model family: deltaformer, gated_deltaproduct, deltaformer_swa, gated_deltaproduct_swa, transformer"""

    flavor: str = "debug"
    """Size within the family: debug, 340M, 1.3B"""

    hf_assets_path: str = "."
    """Unused by titan-delta (the tokenizer comes from [data]); torchtitan only checks that it exists"""


# ModelArgs fields the run sets itself (the tokenizer's vocabulary, [training] seq_len), so a [model] key
# for them would be a second spelling.
MODEL_ARGS_SET_ELSEWHERE = ("vocab_size", "max_seq_len")
# TOML and CLI types of ModelArgs fields typed loosely there (the check of the TOML needs real types).
_OVERRIDE_TYPES: dict[str, typing.Any] = {"layer_pattern": str | list[str]}


def _model_override_fields() -> list[tuple[str, typing.Any, typing.Any]]:
    """One ``[model]`` key per ModelArgs field, default None = the flavor's value. Generated, so a field
    added to ModelArgs is settable without touching this file."""
    hints = typing.get_type_hints(ModelArgs)
    help_text = tyro.conf.arg(help="ModelArgs field (docs/models.md); unset = the flavor's value")
    return [
        (
            f.name,
            typing.Annotated[_OVERRIDE_TYPES.get(f.name, hints[f.name]) | None, help_text],
            field(default=None),
        )
        for f in fields(ModelArgs)
        if not f.name.startswith("_") and f.name not in MODEL_ARGS_SET_ELSEWHERE
    ]


MODEL_OVERRIDE_FIELDS = tuple(name for name, _, _ in _model_override_fields())

# [model]: the family and flavor, plus every ModelArgs field (None = the flavor's value) on top of them.
Model = make_dataclass("Model", _model_override_fields(), bases=(_ModelChoice,))
Model.__module__ = __name__


@dataclass
class Training:
    seed: int = 0
    """Base RNG seed: identical configs give identical runs. ``[debug] seed``, when set, takes precedence
    (torchtitan's spelling of the same setting)"""


@dataclass
class Optimizer:
    no_weight_decay: list[str] = field(default_factory=lambda: list(DEFAULT_NO_WEIGHT_DECAY))
    """Parameters whose name contains one of these get no weight decay (besides all 0-/1-dim ones)"""

    decay_1d_params: bool = False
    """Apply weight decay to 0-/1-dim parameters too (biases, norm scales, A_log, dt_bias)"""


@dataclass
class Metrics:
    peak_tflops: float = 0.0
    """Dense bf16 peak of one device in TFLOP/s for MFU; 0 = torchtitan's table for known GPUs"""


@dataclass
class Checkpoint:
    last_save_model_only: bool = False
    """Save only the model at the last step (True makes the final checkpoint unable to resume)"""


@dataclass
class NanPolicy:
    max_skipped_steps: int = 10
    """Steps with a NaN/Inf gradient norm are skipped (no update); once more than this many were
    skipped in the run, training stops with an error naming the step. 0 = stop at the first one."""


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    optimizer: Optimizer = field(default_factory=Optimizer)
    metrics: Metrics = field(default_factory=Metrics)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    nan_policy: NanPolicy = field(default_factory=NanPolicy)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
