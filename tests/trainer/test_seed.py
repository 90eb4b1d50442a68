"""The finding: with no seed set, two identical debug runs differed at step 1 (10.20126 vs 10.10066).
``[training] seed`` now defaults to 0; ``[debug] seed`` still takes precedence."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.trainer.helpers import DEBUG_CONFIG, REPO, TIMEOUT_S, _env

ARGS = ["--training.steps", "2", "--training.seq_len", "64", "--lr_scheduler.warmup_steps", "1",
        "--metrics.log_freq", "1", "--metrics.disable_color_printing", "--eval.no-enable",
        "--checkpoint.no-enable"]  # fmt: skip


def _losses(dump: Path) -> list[str]:
    cmd = [sys.executable, "-m", "titan_delta.train", "--job.config_file", str(DEBUG_CONFIG),
           "--job.dump_folder", str(dump), *ARGS]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return re.findall(r"step:\s+\d+\s+loss:\s+([\d.]+)", proc.stderr + proc.stdout)


def test_identical_runs_log_identical_losses_by_default(tmp_path: Path) -> None:
    first, second = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert len(first) == 2 and first == second
