"""The JSON report and the table printed after a run.

JSON fields (``schema`` = "titan_delta.state_tracking/1"):
- ``config``: every config section as run; ``task``: name, options, vocab_size, length_unit;
- ``model``: mixers (one per layer), parameters, rope; ``device``, ``torch_version``;
- ``training``: steps_run, wall_time_s (training + curriculum checks), stopped_by ("solved", "steps" or
  "time_limit"), final_train_length, solved (final length reached the threshold), solved_at_step, final_loss;
- ``curriculum_history``: one row per check: step, length, token_accuracy, loss;
- ``length_changes``: step, from, to for every doubling;
- ``eval``: per evaluated length: length, tokens, token_accuracy, sequence_accuracy (every target of a
  sequence right), majority_baseline (always guessing the most common target), sequences, beyond_training.
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


def run_label(report: dict[str, Any]) -> str:
    """A short description of the model: mixers, width, κ1 / n_h and positions."""
    args = report["config"]["model"]["args"]
    mixers = report["model"]["mixers"]
    parts = [f"{len(mixers)}L " + ",".join(sorted(set(mixers))), f"d={args.get('dim')}"]
    if "deltaformer" in mixers:
        parts.append(f"κ1={args.get('deltaformer_kernel', 'softmax')}")
    if "gated_deltaproduct" in mixers:
        parts.append(f"n_h={args.get('gdp_num_householder', 2)}")
        if args.get("gdp_allow_neg_eigval"):
            parts.append("neg")
    parts.append("RoPE" if report["model"]["rope"] else "NoPE")
    return " ".join(parts)


def format_table(reports: list[dict[str, Any]]) -> str:
    """One row per (run, evaluated length), Markdown so it pastes into docs."""
    lines = [
        "| task | model | steps | train s | trained to | length | token acc | seq acc | majority |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for report in reports:
        task = report["task"]
        options = ",".join(f"{k}={v}" for k, v in task["options"].items())
        name = f"{task['name']}({options})" if options else task["name"]
        t = report["training"]
        for row in report["eval"]:
            lines.append(
                f"| {name} | {run_label(report)} | {t['steps_run']} | {t['wall_time_s']:.0f} | "
                f"{t['final_train_length']} | {row['length']} | {row['token_accuracy']:.4f} | "
                f"{row['sequence_accuracy']:.4f} | {row['majority_baseline']:.4f} |"
            )
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
