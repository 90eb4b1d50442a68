"""Experiment config: dataclass sections read from TOML, plus ``--section.key=value`` overrides.

Sections: ``[task]`` (``name`` and the task's options), ``[model]`` (``rope`` and any ModelArgs field
except the vocabulary and context, which the task sets), ``[training]``, ``[curriculum]``, ``[eval]``,
``[output]``. Unknown sections, keys or ill-typed values raise a ValueError naming ``section.key``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_delta.models import ModelArgs
from titan_delta.state_tracking.tasks import task_options

MODEL_DEFAULTS: dict[str, Any] = {
    "mixer": "deltaformer",
    "n_layers": 1,
    "dim": 64,
    "n_heads": 2,
    "multiple_of": 16,
}
TASK_SET_FIELDS = ("vocab_size", "max_seq_len")  # chosen from the task, never by the user
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")  # bf16 = autocast to bfloat16 (weights and optimizer stay fp32)
SCHEDULES = ("constant", "cosine")


@dataclass
class TaskConfig:
    name: str = "swaps"
    options: dict[str, Any] = field(default_factory=dict)  # every other key of [task]


@dataclass
class ModelConfig:
    rope: bool = True  # False = NoPE for every attention-like mixer (attn_rope and deltaformer_rope off)
    args: dict[str, Any] = field(default_factory=lambda: dict(MODEL_DEFAULTS))  # ModelArgs fields


@dataclass
class TrainingConfig:
    steps: int = 2000  # at most this many optimizer steps
    batch_size: int = 64
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # AdamW (beta1, beta2)
    weight_decay: float = 0.01
    warmup_steps: int = 100  # linear warmup, then the schedule
    schedule: str = "constant"  # after warmup: "constant" LR or "cosine" decay to 0 at `steps`
    grad_clip: float = 1.0  # max gradient norm; 0 = off
    seed: int = 0
    seeds: list[int] = field(default_factory=list)  # several runs, one per seed; [] = just `seed`
    device: str = "auto"  # auto = cuda when available
    precision: str = "fp32"  # "fp32" or "bf16" (autocast)
    time_limit_s: float = 0.0  # per seed: stop training after this many seconds; 0 = no limit

    def run_seeds(self) -> list[int]:
        """The seeds to run: ``seeds`` when given, else the single ``seed``."""
        return list(self.seeds) if self.seeds else [self.seed]


@dataclass
class CurriculumConfig:
    start_length: int = 4
    final_length: int = 16
    threshold: float = 0.99  # token accuracy at the current length that doubles it
    eval_every: int = 50  # steps between curriculum checks
    eval_sequences: int = 256  # fresh sequences per check
    stop_when_solved: bool = True  # stop once the final length passes the threshold


@dataclass
class EvalConfig:
    lengths: list[int] = field(default_factory=list)  # [] = final length, 2× and 4× it
    sequences: int = 512
    batch_size: int = 128


@dataclass
class OutputConfig:
    json: str = ""  # path of the JSON report; "" = do not write one
    progress: bool = True  # tqdm progress bar on stderr


@dataclass
class StateTrackingConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def eval_lengths(self) -> list[int]:
        final = self.curriculum.final_length
        return list(self.eval.lengths) if self.eval.lengths else [final, 2 * final, 4 * final]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        t, c, e = self.training, self.curriculum, self.eval
        positive = {
            "training.steps": t.steps, "training.batch_size": t.batch_size,
            "curriculum.start_length": c.start_length, "curriculum.final_length": c.final_length,
            "curriculum.eval_every": c.eval_every, "curriculum.eval_sequences": c.eval_sequences,
            "eval.sequences": e.sequences, "eval.batch_size": e.batch_size,
        }  # fmt: skip
        for key, value in positive.items():
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        if c.start_length > c.final_length:
            raise ValueError(
                f"curriculum.start_length={c.start_length} must be <= "
                f"curriculum.final_length={c.final_length}"
            )
        if not 0.0 < c.threshold <= 1.0:
            raise ValueError(f"curriculum.threshold must be in (0, 1], got {c.threshold}")
        if t.lr <= 0 or t.weight_decay < 0 or t.warmup_steps < 0 or t.grad_clip < 0 or t.time_limit_s < 0:
            raise ValueError(
                "training.lr must be > 0 and training.weight_decay, warmup_steps, grad_clip, time_limit_s "
                f">= 0; got lr={t.lr}, weight_decay={t.weight_decay}, warmup_steps={t.warmup_steps}, "
                f"grad_clip={t.grad_clip}, time_limit_s={t.time_limit_s}"
            )
        if t.device not in DEVICES:
            raise ValueError(f"training.device must be one of {DEVICES}, got {t.device!r}")
        for key, value, allowed in (
            ("precision", t.precision, PRECISIONS),
            ("schedule", t.schedule, SCHEDULES),
        ):
            if value not in allowed:
                raise ValueError(f"training.{key} must be one of {allowed}, got {value!r}")
        numbers = [b for b in t.betas if isinstance(b, int | float) and not isinstance(b, bool)]
        if len(t.betas) != 2 or len(numbers) != 2 or not all(0.0 <= b < 1.0 for b in numbers):
            raise ValueError(f"training.betas must be two numbers in [0, 1), got {t.betas}")
        seeds = t.run_seeds()
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in [t.seed, *seeds]):
            raise ValueError(
                f"training.seed and training.seeds must be integers >= 0, got {t.seed}, {t.seeds}"
            )
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"training.seeds must not repeat a seed, got {t.seeds}")
        if any(not isinstance(n, int) or n < 1 for n in e.lengths):
            raise ValueError(f"eval.lengths must be positive integers, got {e.lengths}")
        allowed = set(task_options(self.task.name))
        unknown = sorted(set(self.task.options) - allowed)
        if unknown:
            raise ValueError(
                f"task.{unknown[0]}: not an option of task {self.task.name!r}; expected {sorted(allowed)}"
            )
        model_fields = {f.name for f in dataclasses.fields(ModelArgs)} - {"_enforced", *TASK_SET_FIELDS}
        for key in self.model.args:
            if key not in model_fields:
                hint = " (set by the task)" if key in TASK_SET_FIELDS else ""
                raise ValueError(
                    f"model.{key}: not a settable ModelArgs field{hint}; expected one of "
                    f"{sorted(model_fields)}"
                )
        try:  # ModelArgs checks sizes and names itself; the task's vocabulary is not known yet
            ModelArgs(vocab_size=2, max_seq_len=2, **self.model.args)
        except (TypeError, ValueError) as error:
            raise ValueError(f"[model]: {error}") from error


def _set_section(section: Any, name: str, values: dict[str, Any]) -> None:
    if name == "task":
        for key, value in values.items():
            if key == "name":
                section.name = value
            else:
                section.options[key] = value
        return
    if name == "model":
        for key, value in values.items():
            if key == "rope":
                section.rope = _typed("model.rope", value, bool)
            else:
                section.args[key] = value
        return
    known = {f.name: f for f in dataclasses.fields(section)}
    for key, value in values.items():
        if key not in known:
            raise ValueError(f"{name}.{key}: unknown key; expected one of {sorted(known)}")
        default = getattr(section, key)
        setattr(section, key, _typed(f"{name}.{key}", value, type(default)))


def _typed(key: str, value: Any, kind: type) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key} must be a {kind.__name__}, got {value!r}")
    return value


def config_from_dict(data: dict[str, Any]) -> StateTrackingConfig:
    config = StateTrackingConfig()
    sections = {f.name for f in dataclasses.fields(config)}
    for name, values in data.items():
        if name not in sections or not isinstance(values, dict):
            raise ValueError(f"[{name}]: unknown config section; expected one of {sorted(sections)}")
        _set_section(getattr(config, name), name, values)
    config.validate()
    return config


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` → (section, key, value); values parse as TOML, else as plain strings."""
    key, sep, raw = text.partition("=")
    section, dot, name = key.partition(".")
    if not sep or not dot or not name:
        raise ValueError(f"override {text!r}: expected section.key=value, e.g. training.steps=500")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, name, value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> StateTrackingConfig:
    """Read a TOML file (or start from the defaults) and apply ``section.key=value`` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    for text in overrides or []:
        section, key, value = parse_override(text)
        data.setdefault(section, {})[key] = value
    return config_from_dict(data)
