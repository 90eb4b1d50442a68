"""The launchers' dry runs print the exact commands they would run; bad settings fail clearly."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from tests.trainer.helpers import REPO

SINGLE = REPO / "launch" / "run_single_node.sh"
SLURM = REPO / "launch" / "slurm_train.sbatch"


def _run(script: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | env
    return subprocess.run(
        ["bash", str(script), *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=30
    )


def test_single_node_dry_run_command() -> None:
    proc = _run(
        SINGLE,
        ["--training.steps", "5", "--job.description", "two words"],
        {"DRY_RUN": "1", "NGPU": "4", "CONFIG": "train_configs/gated_deltaproduct_340M.toml"},
    )
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert words[0] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert words[1:] == [
        "torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=4",
        "--local-ranks-filter=0", "--role=rank", "--tee=3",
        "-m", "titan_delta.train", "--job.config_file", "train_configs/gated_deltaproduct_340M.toml",
        "--training.steps", "5", "--job.description", "two words",
    ]  # fmt: skip


def test_single_node_rejects_bad_settings() -> None:
    proc = _run(SINGLE, [], {"DRY_RUN": "1", "NGPU": "two"})
    assert proc.returncode == 2 and "NGPU must be a positive integer" in proc.stderr
    proc = _run(SINGLE, [], {"DRY_RUN": "1", "NGPU": "1", "CONFIG": "train_configs/nope.toml"})
    assert proc.returncode == 2 and "CONFIG file not found: 'train_configs/nope.toml'" in proc.stderr


def _fake_scontrol(tmp_path: Path) -> dict[str, str]:
    """scontrol that expands our node list like Slurm would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(
        '#!/usr/bin/env bash\n[ "$1 $2" = "show hostnames" ] && printf "gpu-a17\\ngpu-a18\\ngpu-b02\\n"\n'
    )
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_slurm_dry_run_command(tmp_path: Path) -> None:
    env = _fake_scontrol(tmp_path) | {
        "DRY_RUN": "1",
        "CONFIG": "train_configs/deltaformer_1.3B.toml",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "df13b",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "gpu-a[17-18],gpu-b02",
        "SLURM_GPUS_ON_NODE": "h100:8",
    }
    proc = _run(SLURM, ["--training.steps", "100"], env)
    assert proc.returncode == 0, proc.stderr
    assert shlex.split(proc.stdout) == [
        "srun", "--nodes=3", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        "torchrun", "--nnodes=3", "--nproc_per_node=8",
        "--rdzv_id=4242", "--rdzv_backend=c10d", "--rdzv_endpoint=gpu-a17:29500",
        "--max-restarts=0", "--log-dir=outputs/df13b/logs/4242", "--local-ranks-filter=0", "--role=rank",
        "--tee=3", "-m", "titan_delta.train", "--job.config_file", "train_configs/deltaformer_1.3B.toml",
        "--job.dump_folder", "outputs/df13b", "--checkpoint.enable", "--checkpoint.load_step", "-1",
        "--training.steps", "100",
    ]  # fmt: skip


def test_slurm_requires_an_allocation_and_config(tmp_path: Path) -> None:
    proc = _run(SLURM, [], {"DRY_RUN": "1", "CONFIG": "train_configs/debug.toml"})
    assert proc.returncode == 2 and "not inside a Slurm allocation" in proc.stderr
    env = _fake_scontrol(tmp_path) | {"DRY_RUN": "1", "SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "1"}
    proc = _run(SLURM, [], env)
    assert proc.returncode != 0 and "set CONFIG=train_configs/NAME.toml" in proc.stderr
