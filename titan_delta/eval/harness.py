"""Running lm-eval tasks on an adapter and flattening the results into ``{task: {metric: value}}``.

Tasks are loaded first (datasets downloaded or read) and every rank agrees on which loaded, before any
forward runs: a task that fails to load on one rank only is skipped everywhere, so no rank waits for a
collective the others never join. A task that cannot be found or loaded is reported, not raised.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any

from titan_delta.eval.distributed import RankShare
from titan_delta.eval.local_tasks import LOCAL_SUITE, PAPER_SUITE, task_manager_for, task_spec

logger = logging.getLogger(__name__)


@dataclass
class HarnessRun:
    """results: lm-eval's result dict (None on ranks other than 0); failed: task → reason it was skipped."""

    results: dict[str, Any] | None
    failed: dict[str, str] = field(default_factory=dict)


def load_tasks(
    names: list[str], share: RankShare, manager: Any, cache_dir: str | None = None
) -> tuple[list, dict]:
    """Build each task separately, so one bad name or dataset only drops that task."""
    loaded, failed = [], {}
    for name in names:
        try:
            tasks = manager.load([task_spec(name, cache_dir)])
            loaded.append((name, list(tasks["tasks"].values())))
            ok = True
        except Exception as err:  # unknown name, unreachable hub, bad config: all mean "skip this task"
            failed[name] = f"{type(err).__name__}: {err}"
            ok = False
        if share.any_rank(not ok) and ok:
            failed[name] = "failed to load on another rank"
            loaded.pop()
    return [task for _, tasks in loaded for task in tasks], failed


def unknown_task_message(names: list[str], manager: Any = None) -> str | None:
    """One line on the first of ``names`` that lm-eval cannot load (None when every one can): neither a
    shipped task, nor a registered task, group or tag, nor a task YAML file. lm-eval's index of its
    built-in tasks takes seconds to build, so it is built only for names outside the shipped and paper
    suites (and ``manager``, when given, is reused)."""
    expected = (
        "expected a shipped task (" + ", ".join(LOCAL_SUITE) + "), 'local', 'paper', an lm-eval task, "
        "group or tag name, or a task YAML file"
    )
    rest = [name for name in names if name not in LOCAL_SUITE and name not in PAPER_SUITE]
    for name in rest:
        if name.endswith((".yaml", ".yml")) and not os.path.isfile(name):
            return f"{name}: file not found ({expected})"
    rest = [name for name in rest if not os.path.isfile(name)]
    if not rest:
        return None
    known = set((manager or task_manager_for(rest)).all_tasks)
    for name in rest:
        if name not in known:
            close = difflib.get_close_matches(name, [*LOCAL_SUITE, *known], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"{name!r}: unknown task{hint}; {expected}"
    return None


def run_tasks(
    lm: Any,
    names: list[str],
    *,
    limit: float | None = None,
    num_fewshot: int | None = None,
    cache_dir: str | None = None,
    bootstrap_iters: int = 0,
    seed: int = 1234,
    manager: Any = None,
) -> HarnessRun:
    """Evaluate ``names`` with ``lm`` (a ``TitanDeltaEvalLM``). ``limit``: examples per task (a fraction
    when < 1); None = all. ``bootstrap_iters`` = 0 skips stderr bootstrapping (fast; stderr → N/A).
    ``manager``: an lm-eval TaskManager that knows ``names`` (built here when None)."""
    from lm_eval import simple_evaluate

    share = getattr(lm, "share", None) or RankShare()
    manager = manager or task_manager_for(names)
    tasks, failed = load_tasks(names, share, manager, cache_dir)
    for name, reason in failed.items():
        logger.warning(f"eval: skipping task {name!r}: {reason}")
    if not tasks:
        return HarnessRun(None, failed)
    results = simple_evaluate(
        model=lm,
        tasks=tasks,
        num_fewshot=num_fewshot,
        limit=limit,
        bootstrap_iters=bootstrap_iters,
        task_manager=manager,
        log_samples=False,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    return HarnessRun(results if share.rank == 0 else None, failed)


def flatten_metrics(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} of every numeric metric; lm-eval's "acc,none" becomes "acc" and a filter
    other than "none" is kept as a suffix ("exact_match,strict" → "exact_match_strict")."""
    flat: dict[str, dict[str, float]] = {}
    for task, metrics in results.get("results", {}).items():
        values = {}
        for key, value in metrics.items():
            if not isinstance(value, int | float) or isinstance(value, bool) or "," not in key:
                continue
            metric, _, filter_name = key.partition(",")
            name = metric if filter_name in ("", "none") else f"{metric}_{filter_name}"
            if math.isfinite(float(value)):
                values[name] = float(value)
        flat[task] = values
    return flat
