"""Task names: the offline tasks shipped in ``tasks/``, suites by name, and lm-eval's task manager.

lm-eval resolves relative data paths against the working directory, so the shipped YAMLs name their
JSONL files relative to ``tasks/`` and are handed to lm-eval as config dicts with absolute paths.
Building lm-eval's index of its ~15k built-in tasks takes tens of seconds, so it is skipped when every
requested task is a local one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
# The zero-shot suite of the DeltaFormer / DeltaProduct papers (names as lm-eval 0.4.13 registers them).
PAPER_SUITE = (
    "lambada_openai", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "boolq",
    "openbookqa", "social_iqa", "copa", "sciq",
)  # fmt: skip
ALIASES = {"siqa": "social_iqa"}


def local_task_configs(cache_dir: str | None = None) -> dict[str, dict[str, Any]]:
    """name → lm-eval task config for every YAML in ``tasks/``, data files made absolute."""
    configs = {}
    for path in sorted(TASKS_DIR.glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        kwargs = dict(config.get("dataset_kwargs") or {})
        files = kwargs.get("data_files") or {}
        kwargs["data_files"] = {split: str(TASKS_DIR / name) for split, name in files.items()}
        if cache_dir is not None:
            kwargs["cache_dir"] = cache_dir
        configs[config["task"]] = {**config, "dataset_kwargs": kwargs}
    return configs


LOCAL_SUITE = tuple(local_task_configs())
SUITES = {"paper": PAPER_SUITE, "local": LOCAL_SUITE}


def expand_task_names(tasks: str | list[str] | tuple[str, ...]) -> list[str]:
    """Comma-separated string or list → task names, suites ("paper", "local") expanded, aliases mapped,
    duplicates dropped (first occurrence kept)."""
    items = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    names: list[str] = []
    for item in (str(t).strip() for t in items):
        if not item:
            continue
        for name in SUITES.get(item, (item,)):
            name = ALIASES.get(name, name)
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError(f"tasks: expected at least one task name, got {tasks!r}")
    return names


def task_manager_for(names: list[str]) -> Any:
    """lm-eval TaskManager that knows ``names``: built-in index only when a non-local task is asked for."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_defaults=any(name not in LOCAL_SUITE for name in names))


def task_spec(name: str, cache_dir: str | None = None) -> str | dict[str, Any]:
    """What lm-eval's TaskManager.load takes for ``name``: our config dict, or the registered name."""
    return local_task_configs(cache_dir).get(name, name)
