"""The files and folders a training config names, checked before any process group or model is built.

A missing data file, tokenizer, pre-tokenised folder or checkpoint, or an eval task that does not exist,
would otherwise surface deep inside the trainer, on every rank, as a traceback. Each check raises
:class:`ConfigError` with one line naming the setting, the path and what was expected. The checks only
look at what is on disk (and lm-eval's task index for task names that are not shipped): hub datasets
and named tiktoken encodings need the network and are left to the run.
"""

from __future__ import annotations

import json
import os
from typing import Any

from titan_delta.data.config import DataConfig, DataConfigError, data_config_from
from titan_delta.trainer.config_error import ConfigError

TOKENIZER_FILE = (
    "a .tiktoken or Llama-3 tokenizer.model ranks file, or a Hugging Face tokenizer.json or a folder with one"
)
PRETOKENIZED = "a folder written by tools/pretokenize.py"
STEP_FOLDER = "a DCP step-N checkpoint folder, e.g. DUMP/checkpoint/step-0"


def check_paths(job_config: Any) -> None:
    """Raise ConfigError for the first path of ``job_config`` that cannot be used."""
    data = data_config_from(job_config)
    check_tokenizer(data)
    if data.pretokenized:
        check_pretokenized(data.pretokenized)
    else:
        check_sources(data)
    validation = job_config.validation
    if validation.enable and validation.dataset_path:
        check_validation_source(validation.dataset_path, data)
    check_checkpoint_paths(job_config)
    eval_config = getattr(job_config, "eval", None)
    if eval_config is not None and eval_config.enable:
        check_eval_tasks(eval_config.tasks, "[eval] tasks")


def check_tokenizer(data: DataConfig) -> None:
    from titan_delta.data.hf_tokenizer import HF_TOKENIZER_FILE
    from titan_delta.data.tokenizer import NAMED_ENCODINGS, load_tokenizer

    spec = data.tokenizer
    if (spec == "default" or spec in NAMED_ENCODINGS) and not (data.eos_token or data.bos_token):
        return
    path = os.path.expanduser(spec)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, HF_TOKENIZER_FILE)):
        message = f"folder without {HF_TOKENIZER_FILE} (expected {TOKENIZER_FILE})"
        raise ConfigError(f"[data] tokenizer: {spec}: {message}")
    if not os.path.exists(path) and (path.endswith((".tiktoken", ".model", ".json")) or os.sep in path):
        raise ConfigError(f"[data] tokenizer: {spec}: file not found (expected {TOKENIZER_FILE})")
    try:  # also reads the file: bad content, a missing pattern or an unclear EOS are reported here, once
        load_tokenizer(spec, data.tokenizer_pattern, 1, data.eos_token, data.bos_token)
    except DataConfigError as err:
        raise ConfigError(f"[data] tokenizer: {err}") from err


def check_pretokenized(folder: str) -> None:
    from titan_delta.data.pretokenized import INDEX

    if not os.path.isdir(folder):
        what = "not a folder" if os.path.exists(folder) else "folder not found"
        raise ConfigError(f"[data] pretokenized: {folder}: {what} (expected {PRETOKENIZED})")
    index = os.path.join(folder, INDEX)
    if not os.path.isfile(index):
        raise ConfigError(f"[data] pretokenized: {folder}: no {INDEX} (expected {PRETOKENIZED})")
    try:
        with open(index) as f:
            shards = json.load(f)["shards"]
        names = [name for shard in shards for name in (shard["tokens"], shard["docs"])]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"[data] pretokenized: {index}: unreadable ({err})") from err
    if not names:
        raise ConfigError(f"[data] pretokenized: {index}: lists no shards (expected {PRETOKENIZED})")
    for path in (os.path.join(folder, name) for name in names):
        if not os.path.isfile(path):
            raise ConfigError(f"[data] pretokenized: {path}: file not found (listed in {INDEX})")


def check_sources(data: DataConfig) -> None:
    """Every local source matches a file (parsing a hub source touches no network)."""
    from titan_delta.data.sources import parse_source

    for spec in data.sources:
        try:
            parse_source(spec, data.text_field, data.hub_retries, data.hub_backoff_s)
        except DataConfigError as err:
            raise ConfigError(str(err)) from err


def check_validation_source(spec: str, data: DataConfig) -> None:
    """The held-out source parses and, if local, matches a file."""
    from titan_delta.data.sources import parse_source

    try:
        parse_source(spec, data.text_field, data.hub_retries, data.hub_backoff_s)
    except DataConfigError as err:
        message = str(err).removeprefix("[data] sources: ")
        raise ConfigError(f"[validation] dataset_path: {message}") from err


def check_checkpoint_paths(job_config: Any) -> None:
    """An explicitly requested checkpoint (``initial_load_path``, ``load_step``) exists and is whole."""
    from titan_delta.trainer.checkpoint import checkpoint_problem

    ckpt = job_config.checkpoint
    folder = os.path.join(job_config.job.dump_folder, ckpt.folder)
    if ckpt.initial_load_path:
        if not ckpt.enable:
            raise ConfigError("[checkpoint] initial_load_path is set: it needs [checkpoint] enable = true")
        # torchtitan reads it only for a run without a checkpoint folder; a resumed run ignores it.
        if not os.path.exists(folder):
            _check_initial_load_path(ckpt.initial_load_path, ckpt.initial_load_in_hf)
    if ckpt.enable and ckpt.load_step >= 0 and os.path.isdir(folder):
        path = os.path.join(folder, f"step-{ckpt.load_step}")
        problem = checkpoint_problem(path) if os.path.isdir(path) else "folder not found"
        if problem:
            raise ConfigError(
                f"[checkpoint] load_step = {ckpt.load_step}: {path}: {problem} (expected a complete "
                "checkpoint; -1 loads the newest complete one)"
            )


def _check_initial_load_path(path: str, in_hf: bool) -> None:
    from titan_delta.trainer.checkpoint import (
        COMPLETE_MARKER,
        DCP_METADATA,
        checkpoint_problem,
        latest_complete_step,
    )

    where = f"[checkpoint] initial_load_path: {path}"
    if not os.path.isdir(path):
        what = "not a folder" if os.path.exists(path) else "folder not found"
        raise ConfigError(f"{where}: {what} (expected {STEP_FOLDER})")
    if in_hf:
        return
    if not os.path.isfile(os.path.join(path, DCP_METADATA)):
        step = latest_complete_step(path)
        hint = f"; it holds step folders, e.g. {os.path.join(path, f'step-{step}')}" if step >= 0 else ""
        raise ConfigError(f"{where}: no {DCP_METADATA} (expected {STEP_FOLDER}{hint})")
    if os.path.isfile(os.path.join(path, COMPLETE_MARKER)):
        problem = checkpoint_problem(path)
        if problem:
            raise ConfigError(f"{where}: incomplete checkpoint: {problem}")


def check_eval_tasks(tasks: list[str] | str, where: str) -> None:
    from titan_delta.eval.harness import unknown_task_message
    from titan_delta.eval.local_tasks import expand_task_names

    try:
        message = unknown_task_message(expand_task_names(tasks))
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from err
    except ImportError:  # without the 'eval' extra the scheduled eval itself reports what is missing
        return
    if message:
        raise ConfigError(f"{where}: {message}")
