"""Task names → constructors; ``build_task(name, options)`` turns a config section into a task."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from titan_delta.state_tracking.tasks.base import StateTrackingTask
from titan_delta.state_tracking.tasks.mqar import MultiQueryRecallTask
from titan_delta.state_tracking.tasks.parity import ParityTask
from titan_delta.state_tracking.tasks.reachability import DagReachabilityTask
from titan_delta.state_tracking.tasks.swaps import ElementSwapTask
from titan_delta.state_tracking.tasks.word_problems import WordProblemTask

TASKS: dict[str, Callable[..., StateTrackingTask]] = {
    ElementSwapTask.name: ElementSwapTask,
    DagReachabilityTask.name: DagReachabilityTask,
    WordProblemTask.name: WordProblemTask,
    ParityTask.name: ParityTask,
    MultiQueryRecallTask.name: MultiQueryRecallTask,
}


def task_options(name: str) -> dict[str, Any]:
    """The options a task accepts, with their defaults."""
    if name not in TASKS:
        raise ValueError(f"task.name must be one of {tuple(TASKS)}, got {name!r}")
    params = inspect.signature(TASKS[name]).parameters
    return {key: p.default for key, p in params.items()}


def build_task(name: str, options: dict[str, Any] | None = None) -> StateTrackingTask:
    options = dict(options or {})
    unknown = sorted(set(options) - set(task_options(name)))
    if unknown:
        raise ValueError(
            f"task {name}: unknown option(s) {unknown}; expected some of {sorted(task_options(name))}"
        )
    return TASKS[name](**options)
