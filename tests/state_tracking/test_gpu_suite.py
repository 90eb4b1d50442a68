"""tools/bench/proof_state_tracking.sh and its summary (suite.py), exercised on CPU with a tiny config: budget
handling, per-run time limits, the three output files, and runs that did not finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from titan_delta.state_tracking import config_from_dict, run_experiment, write_json
from titan_delta.state_tracking.suite import main as suite_main
from titan_delta.state_tracking.suite import read_status

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "bench" / "proof_state_tracking.sh"
TINY_TOML = """
[task]
name = "parity"
[model]
mixer = "attention"
dim = 16
n_heads = 2
[training]
steps = 5000
batch_size = 8
[curriculum]
start_length = 4
final_length = 8
eval_every = 10
eval_sequences = 16
[eval]
lengths = [8, 16]
sequences = 16
"""


def run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHON": sys.executable, "DEVICE": "cpu", **env}
    return subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], cwd=REPO, env=environment, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


def test_script_runs_the_budgeted_suite_and_writes_three_files(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "tiny.toml").write_text(TINY_TOML)
    done = run_script(
        tmp_path, CONFIG_DIR=str(configs), RUNS="tiny", SEEDS="0,1", BUDGET="36", MIN_SLOT="20",
        OVERHEAD="20", RESERVE="8",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "results.json", "results.md"]
    suite = json.loads((out / "results.json").read_text())
    assert suite["schema"] == "titan_delta.state_tracking.suite/1" and suite["budget_s"] == 36
    (run,) = suite["runs"]
    assert run["status"] == "done" and run["exit_code"] == 0 and run["time_limit_s"] == 1  # (28-20-5)//2
    (report,) = suite["reports"]
    assert report["seeds"] == [0, 1] and report["device"] == "cpu"
    for seed_run in report["runs"]:  # 5000 steps never fit: training stops at its limit and still evaluates
        assert seed_run["training"]["cut_short"] and len(seed_run["eval"]) == 2
    assert run["cut_short"] is True
    assert "| tiny | done | 0 |" in (out / "results.md").read_text()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BUDGET": "4m"}, "BUDGET must be a whole number"),
        ({"SEEDS": "0;1"}, "SEEDS must be comma-separated"),
        ({"RUNS": "no_such_config"}, "no_such_config.toml does not exist"),
    ],
)
def test_script_rejects_bad_settings(tmp_path: Path, env: dict[str, str], message: str) -> None:
    done = run_script(tmp_path, **env)
    assert done.returncode == 2 and message in done.stderr


def test_summary_lists_runs_that_did_not_finish(tmp_path: Path) -> None:
    config = config_from_dict(
        {"task": {"name": "parity"}, "model": {"mixer": "attention", "dim": 16},
         "training": {"steps": 2, "batch_size": 4}, "curriculum": {"final_length": 4},
         "eval": {"lengths": [4], "sequences": 8}, "output": {"progress": False}}
    )  # fmt: skip
    write_json(run_experiment(config, log=lambda _: None), tmp_path / "a.json")
    status = tmp_path / "status.tsv"
    status.write_text(
        f"a\tcfg/a.toml\tdone\t0\t12\t5\t{tmp_path / 'a.json'}\n"
        "b\tcfg/b.toml\ttimeout\t124\t40\t20\t/nowhere/b.json\n"
        "c\tcfg/c.toml\tskipped\t\t\t\t\n"
    )
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert suite_main(["--status", str(status), "--markdown", str(md), "--json", str(js)]) == 0
    suite = json.loads(js.read_text())
    assert [r["status"] for r in suite["runs"]] == ["done", "timeout", "skipped"]
    assert [r["cut_short"] for r in suite["runs"]] == [False, None, None] and len(suite["reports"]) == 1
    text = md.read_text()
    assert "| b | timeout | 124 | 40 | 20 | — |" in text and "| c | skipped | — | — | — | — |" in text


def test_malformed_status_lines_name_the_line(tmp_path: Path) -> None:
    status = tmp_path / "status.tsv"
    status.write_text("a\tcfg\tdone\t0\t1\t1\tpath\nb\tcfg\tfinished\t0\t1\t1\tpath\n")
    with pytest.raises(ValueError, match=r"status\.tsv:2: expected 7 tab-separated fields"):
        read_status(status)
