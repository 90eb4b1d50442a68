"""Training runs shared by the end-to-end tests (each run once per session; all tiny, CPU, gloo).

Every run starts from the same seed checkpoint: sharded initialisation draws random numbers per shard,
so without it a single-process and an FSDP run would start from different weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import checkpointed_fsdp_args, from_seed, train


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer_runs")


@pytest.fixture(scope="session")
def seed_checkpoint(runs_root: Path) -> Path:
    dump = runs_root / "seed"
    train(dump, ["--checkpoint.enable", "--checkpoint.create_seed_checkpoint"])
    path = dump / "checkpoint" / "step-0"
    assert (path / "COMPLETE.json").is_file()
    return path


@pytest.fixture(scope="session")
def fsdp_run(runs_root: Path, seed_checkpoint: Path) -> tuple[Path, str]:
    """FSDP × 2 via the single-node launcher: 6 steps, async checkpoints every 2, keep the latest 2."""
    dump = runs_root / "fsdp2"
    args = [*checkpointed_fsdp_args(seed_checkpoint), "--checkpoint.async_mode", "async"]
    return dump, train(dump, args, nproc=2)


@pytest.fixture(scope="session")
def single_run(runs_root: Path, seed_checkpoint: Path) -> tuple[Path, str]:
    """One process, local batch 2 with 2 accumulation micro-batches: the same 4 rows per step as FSDP × 2."""
    dump = runs_root / "single"
    args = [
        *from_seed(seed_checkpoint),
        "--training.local_batch_size", "2",
        "--training.global_batch_size", "4",
        "--training.steps", "2",
    ]  # fmt: skip
    return dump, train(dump, args)
