"""The launchers' dry runs print the exact commands they would run; bad settings fail clearly."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

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
    proc = _run(SLURM, [], {"CONFIG": "train_configs/debug.toml"})
    assert proc.returncode == 2 and "not inside a Slurm allocation" in proc.stderr
    env = _fake_scontrol(tmp_path) | {"DRY_RUN": "1", "SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "1"}
    proc = _run(SLURM, [], env)
    assert proc.returncode != 0 and "set CONFIG=train_configs/NAME.toml" in proc.stderr


def test_slurm_dry_run_outside_an_allocation() -> None:
    """The layout comes from NNODES, GPUS_PER_NODE and HEAD_NODE, by default 2 nodes of 8 GPUs led by
    this host; the job id is "dry-run"."""
    env = {"DRY_RUN": "1", "CONFIG": "train_configs/debug.toml"}
    words = shlex.split(_run(SLURM, ["--training.steps", "3"], env).stdout)
    assert words[:4] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert words[5:7] == ["--nnodes=2", "--nproc_per_node=8"]
    assert f"--rdzv_endpoint={socket.gethostname()}:29500" in words and "--rdzv_id=dry-run" in words
    assert words[-2:] == ["--training.steps", "3"]
    env |= {"NNODES": "4", "GPUS_PER_NODE": "2", "HEAD_NODE": "gpu-c01", "SLURM_JOB_NAME": "probe"}
    words = shlex.split(_run(SLURM, [], env).stdout)
    assert words[5:7] == ["--nnodes=4", "--nproc_per_node=2"] and "--rdzv_endpoint=gpu-c01:29500" in words
    assert "--log-dir=outputs/probe/logs/dry-run" in words
    proc = _run(SLURM, [], env | {"NNODES": "0"})
    assert proc.returncode == 2 and "NNODES must be a positive integer, got '0'" in proc.stderr


def test_help_prints_usage_only() -> None:
    for script in (SINGLE, SLURM):
        for flag in ("--help", "-h"):
            proc = _run(script, ["--training.steps", "2", flag], {})
            assert proc.returncode == 0 and proc.stderr == "", proc.stderr
            assert "DRY_RUN=1" in proc.stdout and "torchrun" in proc.stdout
            assert len(proc.stdout.splitlines()) < 40 and "#" not in proc.stdout.replace("#SBATCH", "")
    assert not any(line.startswith("#SBATCH") for line in _run(SLURM, ["-h"], {}).stdout.splitlines())


def _fake_nvidia_smi(tmp_path: Path, gpus: int) -> dict[str, str]:
    """nvidia-smi -L listing ``gpus`` GPUs (none: it fails like a driver that is not loaded)."""
    bin_dir = tmp_path / f"bin{gpus}"
    bin_dir.mkdir()
    lines = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\\n" for i in range(gpus))
    body = f'printf "{lines}"' if gpus else 'echo "NVIDIA-SMI has failed" >&2; exit 9'
    (bin_dir / "nvidia-smi").write_text(f"#!/usr/bin/env bash\n{body}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize(
    ("gpus", "visible", "nproc"),
    [(4, None, 4), (4, "1,3", 2), (4, "0,1,2,3,4,5", 4), (4, "2,-1,3", 1), (4, "", 1), (0, None, 1)],
)
def test_single_node_defaults_to_the_visible_gpus(tmp_path: Path, gpus: int, visible, nproc: int) -> None:
    env = _fake_nvidia_smi(tmp_path, gpus) | {"DRY_RUN": "1"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    full_env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "CUDA_VISIBLE_DEVICES")} | env
    proc = subprocess.run(
        ["bash", str(SINGLE)], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    assert f"--nproc_per_node={nproc}" in shlex.split(proc.stdout)


def _fake_srun(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An allocation of one node whose srun only records that it was called."""
    calls = tmp_path / "srun_calls"
    env = _fake_scontrol(tmp_path)
    srun = Path(env["PATH"].split(":")[0]) / "srun"
    srun.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    srun.chmod(0o755)
    env |= {
        "CONFIG": "train_configs/debug.toml",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "gpu-a17",
        "GPUS_PER_NODE": "2",
        "DUMP_FOLDER": str(tmp_path / "dump"),
    }
    return env, calls


def test_slurm_checks_the_config_before_srun(tmp_path: Path) -> None:
    """A missing data file stops the job with the check's one line and exit code 2; srun never runs."""
    env, calls = _fake_srun(tmp_path)
    proc = _run(SLURM, ["--data.sources", str(tmp_path / "gone.parquet")], env)
    assert proc.returncode == 2 and not calls.exists()
    (line,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert f"Config error: [data] sources: {tmp_path}/gone.parquet: file not found" in line
    proc = _run(SLURM, ["--training.steps", "30"], env)
    assert proc.returncode == 0, proc.stderr
    assert calls.read_text().startswith("--nodes=1 ") and "--training.steps 30" in calls.read_text()
