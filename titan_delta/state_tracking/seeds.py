"""Several seeds of one experiment: the papers report means over runs, and one seed of a curriculum run
can land either side of a threshold. ``run_seeds(config)`` runs every seed of ``training.seeds`` one after
the other and returns one report holding each run's report and their mean.

Report fields (``schema`` = "titan_delta.state_tracking.seeds/1"): ``config``, ``task``, ``model``,
``device``, ``device_name``, ``precision``, ``torch_version`` (as in a single run), ``seeds``, ``runs``
(one single-run report per seed, in order) and ``mean``: ``training`` (steps_run and wall_time_s means,
solved_runs, cut_short_runs, final_train_lengths, stopped_by counts) and ``eval`` (per length: token and
sequence accuracy mean, std — population, over seeds —, min and max; majority_baseline mean;
beyond_training_runs).
"""

from __future__ import annotations

import copy
import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

from titan_delta.state_tracking.config import StateTrackingConfig
from titan_delta.state_tracking.trainer import run_experiment

SEEDS_SCHEMA = "titan_delta.state_tracking.seeds/1"


def config_for_seed(config: StateTrackingConfig, seed: int) -> StateTrackingConfig:
    """A copy that runs exactly one seed."""
    single = copy.deepcopy(config)
    single.training.seed, single.training.seeds = seed, []
    return single


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values), "std": statistics.pstdev(values),
        "min": min(values), "max": max(values),
    }  # fmt: skip


def mean_of_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds; runs must share their evaluation lengths (they do when they share a config)."""
    if not runs:
        raise ValueError("mean_of_runs needs at least one run report")
    lengths = [row["length"] for row in runs[0]["eval"]]
    for run in runs[1:]:
        if [row["length"] for row in run["eval"]] != lengths:
            raise ValueError(f"runs were evaluated at different lengths: {lengths} vs {run['eval']}")
    training = [run["training"] for run in runs]
    eval_rows = []
    for i, length in enumerate(lengths):
        rows = [run["eval"][i] for run in runs]
        eval_rows.append({
            "length": length,
            "tokens": rows[0]["tokens"],
            "token_accuracy": _spread([r["token_accuracy"] for r in rows]),
            "sequence_accuracy": _spread([r["sequence_accuracy"] for r in rows]),
            "majority_baseline": statistics.fmean(r["majority_baseline"] for r in rows),
            "beyond_training_runs": sum(bool(r["beyond_training"]) for r in rows),
        })  # fmt: skip
    return {
        "runs": len(runs),
        "training": {
            "steps_run": statistics.fmean(t["steps_run"] for t in training),
            "wall_time_s": statistics.fmean(t["wall_time_s"] for t in training),
            "solved_runs": sum(bool(t["solved"]) for t in training),
            "cut_short_runs": sum(
                bool(t.get("cut_short", t["stopped_by"] == "time_limit")) for t in training
            ),
            "final_train_lengths": [t["final_train_length"] for t in training],
            "stopped_by": dict(Counter(t["stopped_by"] for t in training)),
        },
        "eval": eval_rows,
    }


def aggregate_runs(config: StateTrackingConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One report for several single-seed reports of ``config``."""
    first = runs[0]
    return {
        "schema": SEEDS_SCHEMA,
        "config": config.to_dict(),
        "task": first["task"],
        "model": first["model"],
        "device": first["device"],
        "device_name": first.get("device_name", first["device"]),
        "precision": first.get("precision", "fp32"),
        "torch_version": first["torch_version"],
        "seeds": [run["seed"] for run in runs],
        "runs": runs,
        "mean": mean_of_runs(runs),
    }


def run_seeds(config: StateTrackingConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``config.training.run_seeds()`` in order (``time_limit_s`` applies to each) and aggregate."""
    runs = []
    for seed in config.training.run_seeds():
        runs.append(run_experiment(config_for_seed(config, seed), log=log))
    return aggregate_runs(config, runs)
