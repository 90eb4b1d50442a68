"""Config errors that name the file, the section, the key and what was expected.

torchtitan reports an unknown TOML key as a set of names inside a class repr and does not check value
types at all (a TOML string lands in an int field unnoticed). We check the TOML against the merged
config classes before torchtitan parses it, and the parsed JobConfig against what titan-delta supports.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Literal

from torchtitan.config import JobConfig as TorchtitanJobConfig

from titan_delta.trainer.config_error import ConfigError


def load_toml(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ConfigError(f"--job.config_file {path}: file not found")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from err


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, f.type) for f in fields(cls) if not f.name.startswith("_")}


def merged_schema(*config_classes: type) -> dict[str, Any]:
    """{section: {key: type}} (nested for sub-sections) over several JobConfig classes; later wins."""
    schema: dict[str, Any] = {}
    for cls in config_classes:
        _merge_into(schema, cls)
    return schema


def _merge_into(schema: dict[str, Any], cls: type) -> None:
    for name, tp in _field_types(cls).items():
        if is_dataclass(tp):
            sub = schema.get(name)
            if not isinstance(sub, dict):
                sub = schema[name] = {}
            _merge_into(sub, tp)
        else:
            schema[name] = tp


def _suggest(name: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"list of {_type_name(inner)}"
    return "none" if tp is type(None) else getattr(tp, "__name__", str(tp))


def value_matches(value: Any, tp: Any) -> bool:
    """Whether a TOML value fits a config field type (int accepted for float; no other coercion)."""
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(value_matches(value, a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return isinstance(value, list) and all(value_matches(v, inner) for v in value)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def check_toml(values: dict[str, Any], schema: dict[str, Any], source: str, prefix: str = "") -> None:
    """Raise ConfigError at the first unknown section/key or ill-typed value."""
    for key, value in values.items():
        where = f"[{prefix}]" if prefix else "top level"
        if key not in schema:
            kind = "key" if prefix else "section"
            raise ConfigError(
                f"{source}: unknown {kind} {key!r} in {where}{_suggest(key, schema)}; "
                f"valid: {', '.join(sorted(schema))}"
            )
        expected = schema[key]
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(expected, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {path} must be a table [{path}], got {value!r}")
            check_toml(value, expected, source, path)
        elif not value_matches(value, expected):
            raise ConfigError(f"{source}: [{prefix}] {key} = {value!r}: expected {_type_name(expected)}")


def check_config_file(path: str, custom_config_class: type) -> dict[str, Any]:
    """Load and check a TOML config against torchtitan's JobConfig merged with ours."""
    values = load_toml(path)
    check_toml(values, merged_schema(TorchtitanJobConfig, custom_config_class), path)
    return values


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_validation(v: Any) -> None:
    if not v.enable:
        return
    _require(v.freq >= 1, f"[validation] freq = {v.freq}: expected >= 1")
    _require(
        v.steps >= 1 or v.steps == -1, f"[validation] steps = {v.steps}: expected >= 1 or -1 (whole set)"
    )
    _require(v.local_batch_size >= 1, f"[validation] local_batch_size = {v.local_batch_size}: expected >= 1")
    _require(
        bool(v.dataset_path),
        "[validation] dataset_path is not set: expected the held-out source, e.g. 'jsonl:held_out/*.jsonl'",
    )


def _check_profiling(p: Any) -> None:
    if not p.enable_profiling:
        return
    _require(
        p.profile_freq >= p.profiler_warmup + p.profiler_active,
        f"[profiling] profile_freq = {p.profile_freq}: expected >= profiler_warmup + profiler_active "
        f"= {p.profiler_warmup + p.profiler_active}",
    )
    import torch

    # torchtitan 0.2.2 asks the profiler for CPU and CUDA (or XPU) activities and fails without either
    _require(
        torch.cuda.is_available() or torch.xpu.is_available(),
        "[profiling] enable_profiling = true: torchtitan's profiler needs a CUDA (or XPU) device; none here",
    )


def check_job_config(job_config: Any, families: dict[str, typing.Collection[str]]) -> None:
    """Semantic checks of a parsed JobConfig; ``families`` maps each registered model name to its flavors."""
    # Imported here: these modules import torchtitan components that are heavier than the checks.
    from titan_delta.data.config import data_config_from
    from titan_delta.trainer.activation_checkpoint import AC_MODES, parse_every_n
    from titan_delta.trainer.lr_schedule import schedule_phases
    from titan_delta.trainer.metrics import require_wandb
    from titan_delta.trainer.model_overrides import resolve_job_model_args
    from titan_delta.trainer.optimizer import optimizer_kwargs_from_config

    model, training = job_config.model, job_config.training
    _require(
        model.name in families,
        f"[model] name = {model.name!r}: unknown model{_suggest(model.name, families)}; "
        f"expected one of {sorted(families)}",
    )
    _require(
        model.flavor in families[model.name],
        f"[model] flavor = {model.flavor!r}: {model.name} has flavors {sorted(families[model.name])}",
    )
    resolve_job_model_args(job_config)  # every [model] field override, validated as ModelArgs
    for key in ("steps", "local_batch_size", "seq_len"):
        _require(getattr(training, key) >= 1, f"[training] {key} = {getattr(training, key)}: expected >= 1")
    gbs = training.global_batch_size
    _require(gbs == -1 or gbs >= 1, f"[training] global_batch_size = {gbs}: expected -1 (auto) or >= 1")
    _require(training.max_norm > 0, f"[training] max_norm = {training.max_norm}: expected > 0")
    _check_validation(job_config.validation)
    _check_profiling(job_config.profiling)
    if hasattr(job_config, "eval"):
        try:
            job_config.eval.validate()
        except ValueError as err:
            raise ConfigError(str(err)) from err
    ckpt = job_config.checkpoint
    _require(ckpt.interval >= 1, f"[checkpoint] interval = {ckpt.interval}: expected >= 1")
    _require(
        ckpt.keep_latest_k == 0 or ckpt.keep_latest_k >= 2,
        f"[checkpoint] keep_latest_k = {ckpt.keep_latest_k}: expected 0 (keep all) or >= 2 "
        "(the newest may still be being written)",
    )
    _require(
        ckpt.load_step >= -1, f"[checkpoint] load_step = {ckpt.load_step}: expected -1 (latest) or a step"
    )
    _require(
        not ckpt.create_seed_checkpoint or ckpt.enable,
        "[checkpoint] create_seed_checkpoint = true needs [checkpoint] enable = true",
    )
    par = job_config.parallelism
    replicate, shard = par.data_parallel_replicate_degree, par.data_parallel_shard_degree
    _require(
        replicate >= 1 or (replicate == -1 and (shard >= 1 or shard == -1)),
        f"[parallelism] data_parallel_replicate_degree = {replicate}: expected >= 1, or -1 (every rank "
        "not used by the shard degree) with data_parallel_shard_degree >= 1 or -1 (the GPUs of one node)",
    )
    for key in (
        "tensor_parallel_degree",
        "context_parallel_degree",
        "pipeline_parallel_degree",
        "expert_parallel_degree",
    ):
        _require(
            getattr(par, key) == 1,
            f"[parallelism] {key} = {getattr(par, key)}: titan-delta supports data parallelism only "
            "(data_parallel_shard_degree, data_parallel_replicate_degree)",
        )
    ac = job_config.activation_checkpoint
    _require(ac.mode in AC_MODES, f"[activation_checkpoint] mode = {ac.mode!r}: expected one of {AC_MODES}")
    try:
        if ac.mode == "selective":
            parse_every_n(ac.selective_ac_option)
        schedule_phases(job_config.lr_scheduler, training.steps)
        optimizer_kwargs_from_config(job_config.optimizer)
        data_config_from(job_config)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    unknown = set(job_config.compile.components) - {"model", "loss"}
    _require(
        not unknown, f"[compile] components = {job_config.compile.components}: expected 'model' and/or 'loss'"
    )
    skips = job_config.nan_policy.max_skipped_steps
    _require(skips >= 0, f"[nan_policy] max_skipped_steps = {skips}: expected >= 0")
    peak = job_config.metrics.peak_tflops
    _require(peak >= 0, f"[metrics] peak_tflops = {peak}: expected >= 0 (0 = built-in table)")
    require_wandb(job_config)
