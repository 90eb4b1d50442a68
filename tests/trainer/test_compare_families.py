"""tools/bench/compare_families.py on CPU processes: two debug-size families trained on the same data for
the same tokens with validation and the offline lm-eval tasks, one results row each and the curves as PNGs;
a run that fails gets a FAILED row and exit code 1; bad arguments exit 2 with one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "bench" / "compare_families.py"
SMALL = ["--config", "train_configs/debug.toml", "--tokens", "6144", "--global-batch", "4",
         "--local-batch", "2", "--data", "default", "--heldout", "default", "--val-freq", "3",
         "--val-steps", "2", "--warmup-steps", "2", "--log-freq", "2", "--warmup-logs", "1"]  # fmt: skip


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


@pytest.mark.slow
def test_two_families_at_equal_tokens(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    runs = ["transformer", "gated_deltaproduct:gdp_num_householder=1", "deltaformer:no_such_field=1"]
    proc = _run([*SMALL, "--out", str(out), "--runs", *runs])
    assert proc.returncode == 1, proc.stderr[-2000:]
    table = (out / "results.md").read_text().splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in table[2:5]}
    for run in ("transformer", "gated_deltaproduct:gdp_num_householder=1"):
        row = dict(zip(header, rows[run], strict=True))
        assert row["steps"] == "6" and row["tokens"] == "6,144"
        assert 0 < float(row["final validation/loss"]) < 20 and row["at step"] in {"3", "6"}
        assert float(row["tokens/s per GPU"].replace(",", "")) > 0
        assert "titan_delta_tiny_mc/acc" in row and row["titan_delta_tiny_mc/acc"] != "-"
        assert row["device"] == "CPU x1"
    assert rows["deltaformer:no_such_field=1"][1].startswith("FAILED")
    by_step = table[table.index("| step | " + " | ".join(runs) + " |") + 2 :]
    assert [line.split("|")[1].strip() for line in by_step] == ["6"]  # every 2 x val-freq, and the last
    final = dict(zip(header, rows["transformer"], strict=True))["final validation/loss"]
    assert by_step[0].split("|")[2].strip() == final and by_step[0].split("|")[4].strip() == "—"
    for png in ("validation_loss.png", "validation_bpb.png", "loss_metrics_global_avg_loss.png"):
        assert (out / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The table rebuilt from the run folders alone: the same rows; a run stopped from outside (no exit_code)
    # is INCOMPLETE with its curves and no lm-eval; a run never trained says so.
    (out / "plots").rename(out / "plots_first")
    stopped_run = out / "gated_deltaproduct_gdp_num_householder1"
    (stopped_run / "exit_code").unlink()
    shutil.rmtree(stopped_run / "eval")
    again = _run([*SMALL, "--out", str(out), "--report-only", "--runs", *runs[:2], "transformer:n_layers=2"])
    assert again.returncode == 1, again.stderr[-2000:]
    rebuilt = (out / "results.md").read_text().splitlines()
    assert rebuilt[:3] == table[:3]
    stopped = dict(zip(header, [c.strip() for c in rebuilt[3].strip("|").split("|")], strict=True))
    assert stopped["steps"] == "INCOMPLETE: 6 of 6" and stopped["titan_delta_tiny_mc/acc"] == "-"
    assert stopped["final validation/loss"] == rows["gated_deltaproduct:gdp_num_householder=1"][6]
    assert "NOT RUN" in rebuilt[4] and not (out / "transformer_n_layers2").exists()
    assert (out / "plots" / "validation_loss.png").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runs", "nope"], "nope_340M.toml not found"),
        (["--runs", "transformer:x"], "expected family[:field=value,...]"),
        (["--runs", "transformer", "--global-batch", "6", "--local-batch", "4"], "multiple of --local-batch"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str], message: str) -> None:
    proc = _run([*args, "--tokens", "1e6", "--data", "default", "--heldout", "default"])
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
