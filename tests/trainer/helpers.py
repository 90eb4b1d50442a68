"""Run the real trainer in subprocesses (one process, or torchrun through launch/run_single_node.sh) on
the CPU with gloo, and read back what it logged to TensorBoard."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEBUG_CONFIG = REPO / "train_configs" / "debug.toml"
LAUNCHER = REPO / "launch" / "run_single_node.sh"
TIMEOUT_S = 240

# Tiny and fast: the debug flavor, 64-token rows, every step logged, full-precision logs.
BASE_ARGS = [
    "--job.config_file", str(DEBUG_CONFIG),
    "--training.seq_len", "64",
    "--metrics.log_freq", "1",
    "--metrics.disable_color_printing",
    "--lr_scheduler.warmup_steps", "1",
    "--debug.seed", "7",
    "--data.num_workers", "0",
    "--eval.no-enable",  # the scheduled evals have their own test (tests/trainer/test_scheduled_eval.py)
]  # fmt: skip
# Extra trainer arguments for every run, e.g. bf16 parameters when tools/bench/proof_checkpoint.sh runs these
# tests on GPUs (they run on whatever device torch finds).
EXTRA_ARGS = shlex.split(os.environ.get("TITAN_DELTA_TEST_TRAIN_ARGS", ""))


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LOCAL_RANK", None)
    # PREFLIGHT=0: the launcher's config check (tests/trainer/test_path_errors.py) would add a process start
    # to every launcher run here
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "LOG_RANK": "0,1,2,3", "PREFLIGHT": "0"})
    env.update(extra or {})
    return env


FAULTS_ENTRY = "tests.trainer.faults"  # titan_delta.train with injected faults (tests/trainer/faults.py)


def command(
    dump: Path, args: list[str], nproc: int = 1, fault: dict | None = None, rows_dir: Path | None = None
) -> tuple[list[str], dict[str, str]]:
    """The trainer's command: one process, the single-node launcher, or (with a fault or a row record)
    torchrun running the fault-injecting entry point on every rank."""
    train_args = [*BASE_ARGS, *EXTRA_ARGS, "--job.dump_folder", str(dump), *args]
    if fault is not None or rows_dir is not None:
        extra = {"TITAN_DELTA_FAULT": json.dumps(fault) if fault else ""}
        extra["TITAN_DELTA_ROWS_DIR"] = str(rows_dir or "")
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                    f"--nproc_per_node={nproc}", "--role=rank", "--tee=3"]  # fmt: skip
        return [*torchrun, "-m", FAULTS_ENTRY, *train_args], _env(extra)
    if nproc == 1:
        return [sys.executable, "-m", "titan_delta.train", *train_args], _env()
    return ["bash", str(LAUNCHER), *train_args], _env({"NGPU": str(nproc), "CONFIG": str(DEBUG_CONFIG)})


def train(
    dump: Path,
    args: list[str],
    nproc: int = 1,
    expect_rc: int | None = 0,
    fault: dict | None = None,
    rows_dir: Path | None = None,
) -> str:
    """Run to completion; returns the combined output, asserting the exit code (None: any)."""
    cmd, env = command(dump, args, nproc, fault, rows_dir)
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S
    )
    if expect_rc is not None:
        assert proc.returncode == expect_rc, (
            f"exit code {proc.returncode} != {expect_rc}:\n{proc.stdout[-6000:]}"
        )
    return proc.stdout


def train_until(
    dump: Path,
    args: list[str],
    nproc: int,
    marker: str,
    fault: dict | None = None,
    rows_dir: Path | None = None,
) -> str:
    """Start training and SIGKILL the whole job (every process) once ``marker`` appears in its output."""
    cmd, env = command(dump, args, nproc, fault, rows_dir)
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + TIMEOUT_S
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if marker in line or time.monotonic() > deadline:
            break
    kill_tree(proc.pid)
    proc.wait()
    output = "".join(lines)
    assert marker in output, f"never saw {marker!r}:\n{output[-6000:]}"
    return output


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (torchrun starts its workers in their own sessions, so killing
    the launcher's process group alone would leave them training)."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants at once, like a node failure."""
    for victim in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def scalars(dump: Path, tag: str, tb_folder: str = "tb") -> dict[int, float]:
    """{step: value} of one TensorBoard scalar written under ``dump/tb_folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[int, float] = {}
    for run_dir in sorted(
        {os.path.dirname(p) for p in glob.glob(f"{dump}/{tb_folder}/**/events.*", recursive=True)}
    ):
        acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            values.update({e.step: e.value for e in acc.Scalars(tag)})
    return values


def scalar_tags(dump: Path, tb_folder: str = "tb") -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for path in glob.glob(f"{dump}/{tb_folder}/**/events.*", recursive=True):
        acc = EventAccumulator(os.path.dirname(path), size_guidance={"scalars": 0})
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    return tags


def parsed_debug_config(*overrides: str):
    """The debug config parsed as the trainer parses it (our sections merged), with CLI overrides."""
    from torchtitan.config import ConfigManager

    from titan_delta.train import build_args
    from titan_delta.trainer import setup_torchtitan

    setup_torchtitan()
    return ConfigManager().parse_args(build_args(["--job.config_file", str(DEBUG_CONFIG), *overrides]))


STEPS_LONG = 6  # the FSDP reference run (also the uninterrupted run of the resume test)


def from_seed(seed_checkpoint: Path) -> list[str]:
    return ["--checkpoint.enable", "--checkpoint.initial_load_path", str(seed_checkpoint)]


def checkpointed_fsdp_args(seed_checkpoint: Path) -> list[str]:
    """The FSDP × 2 run that the resume test repeats: from the seed, 6 steps, checkpoints every 2, keep 2."""
    return [
        *from_seed(seed_checkpoint),
        "--training.local_batch_size", "2",
        "--training.steps", str(STEPS_LONG),
        "--checkpoint.interval", "2",
        "--checkpoint.keep_latest_k", "2",
    ]  # fmt: skip
