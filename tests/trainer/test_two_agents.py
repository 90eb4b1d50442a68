"""Two torchrun agents on one host stand in for two nodes: the 1.3B configs' layout (both degrees -1: shard
inside a node, replicate across) becomes HSDP replicate 2 × shard 2 over gloo, saves, then a second launch
of both agents resumes from the newest complete checkpoint."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.helpers import BASE_ARGS, REPO, TIMEOUT_S, _env, scalars

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_agents(dump: Path, args: list[str]) -> list[str]:
    """Start node_rank 0 and 1 (two processes each) at one c10d rendezvous; returns both outputs."""
    port = _free_port()
    train_args = [*BASE_ARGS, "--job.dump_folder", str(dump), *args]
    rendezvous = ["--nnodes=2", "--nproc_per_node=2", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=two-agents-{port}"]  # fmt: skip
    commands = [
        [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--node_rank={node}", "--role=rank",
         "--tee=3", "-m", "titan_delta.train", *train_args]
        for node in (0, 1)
    ]  # fmt: skip
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    agents = [subprocess.Popen(cmd, cwd=REPO, env=_env(), **pipes) for cmd in commands]
    outputs = [agent.communicate(timeout=TIMEOUT_S)[0] for agent in agents]
    for node, (agent, output) in enumerate(zip(agents, outputs, strict=True)):
        assert agent.returncode == 0, f"node {node} exited {agent.returncode}:\n{output[-5000:]}"
    return outputs


def test_hsdp_over_two_agents_saves_and_resumes(tmp_path: Path) -> None:
    dump = tmp_path / "two_agents"
    hsdp = [
        "--parallelism.data_parallel_replicate_degree", "-1",
        "--parallelism.data_parallel_shard_degree", "-1",
        "--training.local_batch_size", "1",
        "--checkpoint.enable", "--checkpoint.interval", "2",
    ]  # fmt: skip
    first = _two_agents(dump, [*hsdp, "--training.steps", "4"])
    assert "Applied HSDP over mesh (2, 2)" in first[0]
    assert (dump / "checkpoint" / "step-4" / "COMPLETE.json").is_file()
    second = _two_agents(dump, [*hsdp, "--training.steps", "6", "--metrics.save_tb_folder", "tb_resumed"])
    assert "Training starts at step 5" in second[0]
    assert sorted(scalars(dump, "loss_metrics/global_avg_loss", tb_folder="tb_resumed")) == [5, 6]
