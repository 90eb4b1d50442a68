"""Scheduled lm-eval inside a real training run: TensorBoard scalars under eval/<task>/<metric> and one
JSONL line per task and eval, at the interval and after the last step, with training unaffected."""

from __future__ import annotations

import json
import math

from tests.trainer.helpers import scalar_tags, scalars, train


def test_debug_run_with_interval_logs_eval_scalars_and_jsonl(tmp_path) -> None:
    dump = tmp_path / "run"
    args = [
        "--training.steps", "3",
        "--eval.enable",
        "--eval.interval", "2",
        "--eval.tasks", "titan_delta_tiny_mc",
        "--eval.limit", "3",
    ]  # fmt: skip
    output = train(dump, args)
    assert "eval at step 2" in output and "eval at step 3" in output

    tags = {t for t in scalar_tags(dump) if t.startswith("eval/")}
    assert "eval/titan_delta_tiny_mc/acc" in tags, sorted(tags)
    acc = scalars(dump, "eval/titan_delta_tiny_mc/acc")
    assert sorted(acc) == [2, 3]
    assert all(0.0 <= v <= 1.0 for v in acc.values())

    lines = [json.loads(line) for line in (dump / "eval" / "results.jsonl").read_text().splitlines()]
    assert [(r["step"], r["task"]) for r in lines] == [(2, "titan_delta_tiny_mc"), (3, "titan_delta_tiny_mc")]
    assert lines[0]["tokens_seen"] == 2 * 4 * 64 and lines[1]["tokens_seen"] == 3 * 4 * 64
    assert math.isclose(lines[1]["metrics"]["acc"], acc[3], rel_tol=1e-6)  # TensorBoard keeps float32
    # training went on after each eval: every step logged its loss
    assert sorted(scalars(dump, "loss_metrics/global_avg_loss")) == [1, 2, 3]
