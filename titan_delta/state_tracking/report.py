"""The JSON report and the table printed after a run.

Single-run JSON fields (``schema`` = "titan_delta.state_tracking/1"):
- ``config``: every config section as run; ``task``: name, options, vocab_size, length_unit;
- ``model``: mixers (one per layer), parameters, rope; ``device`` ("cpu"/"cuda"), ``device_name`` (the GPU's
  name on CUDA), ``precision``, ``seed``, ``torch_version``;
- ``training``: steps_run, wall_time_s (training + curriculum checks), stopped_by ("solved", "steps" or
  "time_limit"), cut_short (stopped by the time limit), final_train_length, solved (final length reached
  the threshold), solved_at_step, final_loss;
- ``curriculum_history``: one row per check: step, length, token_accuracy, loss;
- ``length_changes``: step, from, to for every doubling;
- ``eval``: per evaluated length: length, tokens, token_accuracy, sequence_accuracy (every target of a
  sequence right), majority_baseline (always guessing the most common target), sequences, beyond_training.
Several seeds: seeds.py. Several experiments in one file (``--combine``): ``schema`` =
"titan_delta.state_tracking.suite/1", ``reports`` (single-run or several-seed reports), plus whatever the
caller records (e.g. the GPU script's runs that did not finish).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPORT_FIELDS = (
    "schema", "config", "task", "model", "device", "torch_version",
    "training", "curriculum_history", "length_changes", "eval",
)  # fmt: skip
EVAL_FIELDS = (
    "length", "tokens", "token_accuracy", "sequence_accuracy", "majority_baseline", "sequences",
    "beyond_training",
)  # fmt: skip
SUITE_SCHEMA = "titan_delta.state_tracking.suite/1"
TABLE_HEADER = (
    "| task | model | seeds | steps | train s | stopped by | trained to | length | token acc | seq acc "
    "| majority |\n| --- | --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |"
)


def run_label(report: dict[str, Any]) -> str:
    """A short description of the model: mixers, width, κ1 / n_h, positions and precision."""
    args = report["config"]["model"]["args"]
    mixers = report["model"]["mixers"]
    parts = [f"{len(mixers)}L " + ",".join(sorted(set(mixers))), f"d={args.get('dim')}"]
    if "deltaformer" in mixers:
        parts.append(f"κ1={args.get('deltaformer_kernel', 'softmax')}")
    if "gated_deltaproduct" in mixers:
        parts.append(f"n_h={args.get('gdp_num_householder', 2)}")
        if args.get("gdp_allow_neg_eigval"):
            parts.append("neg")
    if set(mixers) - {"gated_deltaproduct"}:  # positions only mean something to attention-like mixers
        parts.append("RoPE" if report["model"]["rope"] else "NoPE")
    if "precision" in report:
        parts.append(report["precision"])
    return " ".join(parts)


def _task_name(report: dict[str, Any]) -> str:
    task = report["task"]
    options = ",".join(f"{k}={v}" for k, v in task["options"].items())
    return f"{task['name']}({options})" if options else task["name"]


def _single_rows(report: dict[str, Any]) -> list[str]:
    t = report["training"]
    seed = report.get("seed", report["config"]["training"]["seed"])
    return [
        f"| {_task_name(report)} | {run_label(report)} | {seed} | {t['steps_run']} | "
        f"{t['wall_time_s']:.0f} | {t['stopped_by']} | {t['final_train_length']} | {row['length']} | "
        f"{row['token_accuracy']:.4f} | {row['sequence_accuracy']:.4f} | {row['majority_baseline']:.4f} |"
        for row in report["eval"]
    ]


def _seeds_rows(report: dict[str, Any]) -> list[str]:
    """Mean ± std (population) over seeds; stopped by as counts, trained to as one length per seed."""
    mean = report["mean"]
    t = mean["training"]
    seeds = ",".join(str(s) for s in report["seeds"])
    stopped = ", ".join(f"{k} {v}/{mean['runs']}" for k, v in sorted(t["stopped_by"].items()))
    reached = ",".join(str(n) for n in t["final_train_lengths"])
    return [
        f"| {_task_name(report)} | {run_label(report)} | {seeds} | {t['steps_run']:.0f} | "
        f"{t['wall_time_s']:.0f} | {stopped} | {reached} | {row['length']} | "
        f"{row['token_accuracy']['mean']:.4f} ± {row['token_accuracy']['std']:.4f} | "
        f"{row['sequence_accuracy']['mean']:.4f} ± {row['sequence_accuracy']['std']:.4f} | "
        f"{row['majority_baseline']:.4f} |"
        for row in mean["eval"]
    ]


def expand_reports(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The experiment reports in a JSON file: itself, or the ``reports`` of a combined suite file."""
    if data.get("schema") == SUITE_SCHEMA:
        return list(data["reports"])
    return [data]


def format_table(reports: list[dict[str, Any]]) -> str:
    """One row per (experiment, evaluated length), Markdown so it pastes into docs. Several-seed reports
    show the mean ± std over seeds (their per-seed numbers are in the JSON)."""
    lines = [TABLE_HEADER]
    for report in reports:
        lines.extend(_seeds_rows(report) if "runs" in report else _single_rows(report))
    return "\n".join(lines)


def combine_reports(reports: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One JSON document for a suite of experiments."""
    return {"schema": SUITE_SCHEMA, "reports": reports, **extra}


def write_json(report: dict[str, Any], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
