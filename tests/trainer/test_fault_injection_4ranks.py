"""Faults at 4 CPU ranks (gloo, torchrun): a FSDP×4 run killed at a random step resumes bitwise exactly;
its checkpoint resumes on 2 ranks under DDP with every token seen exactly once.

Rows are recorded per rank and step by tests/trainer/faults.py. With 8 lanes every rank owns whole lanes at
4 and at 2 ranks, and each lane is a deterministic stream of rows, so "exactly once" means: the rows both
runs consumed are, lane by lane, the first rows of that lane, with none repeated and none skipped.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.trainer.faults import row_hashes
from tests.trainer.helpers import from_seed, scalars, train, train_until
from titan_delta.data import DataConfig
from titan_delta.data.loader import build_dataloader
from titan_delta.data.tokenizer import load_tokenizer
from titan_delta.trainer.checkpoint import list_checkpoint_dirs

pytestmark = pytest.mark.slow
LANES, SEQ_LEN, STEPS = 8, 64, 6
LOSS = "loss_metrics/global_avg_loss"


def _args(seed_checkpoint: Path, local_batch: int, replicate: int = 1, shard: int = -1) -> list[str]:
    return [
        *from_seed(seed_checkpoint),
        "--training.local_batch_size", str(local_batch),
        "--training.steps", str(STEPS),
        "--checkpoint.interval", "2",
        "--checkpoint.keep_latest_k", "3",
        "--data.lanes", str(LANES),
        "--parallelism.data_parallel_replicate_degree", str(replicate),
        "--parallelism.data_parallel_shard_degree", str(shard),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def fsdp4_run(runs_root: Path, seed_checkpoint: Path) -> Path:
    dump = runs_root / "fsdp4"
    train(dump, _args(seed_checkpoint, local_batch=1), nproc=4, rows_dir=dump / "rows")
    saved = [c.step for c in list_checkpoint_dirs(str(dump / "checkpoint")) if c.complete]
    assert saved == [2, 4, 6]
    return dump


def test_fsdp4_killed_at_a_random_step_resumes_exactly(runs_root, seed_checkpoint, fsdp4_run) -> None:
    dump = runs_root / "fsdp4_killed"
    args = _args(seed_checkpoint, local_batch=1)
    kill_step = random.choice([3, 4, 5])
    train_until(dump, args, nproc=4, marker=f"step:  {kill_step}")
    output = train(dump, [*args, "--metrics.save_tb_folder", "tb_resumed"], nproc=4)
    resume_from = int(output.split("Training starts at step ")[1].split()[0]) - 1
    assert resume_from in (2, 4), (kill_step, resume_from)
    for tag in (LOSS, "grad_norm", "lr"):
        got, want = scalars(dump, tag, tb_folder="tb_resumed"), scalars(fsdp4_run, tag)
        assert sorted(got) == list(range(resume_from + 1, STEPS + 1)), (kill_step, got)
        for step in got:
            assert got[step] == want[step], f"killed at {kill_step}: {tag} at step {step}"


def _recorded(rows_dir: Path, steps: int | None = None) -> list[str]:
    """Row hashes of every rank's first ``steps`` batches."""
    rows = []
    for path in sorted(rows_dir.glob("rank*.txt")):
        lines = path.read_text().splitlines()
        rows += [h for line in lines[:steps] for h in line.split()]
    return rows


def _lane_rows(rows_per_lane: int) -> dict[str, tuple[int, int]]:
    """{row hash: (lane, index in that lane)} of each lane's first rows, read straight from the data."""
    tokenizer = load_tokenizer("default")
    config = DataConfig(sources=["default"], lanes=LANES, num_workers=0)
    job = SimpleNamespace(data=config, training=SimpleNamespace(seq_len=SEQ_LEN, local_batch_size=1))
    where = {}
    for lane in range(LANES):  # at world size = lanes, rank r owns lane r alone
        loader = build_dataloader(LANES, lane, tokenizer, job)
        for index, (batch, labels) in zip(range(rows_per_lane), loader, strict=False):
            (digest,) = row_hashes(batch["input"], labels)
            assert digest not in where, "a repeated row in the corpus makes row hashes ambiguous"
            where[digest] = (lane, index)
    return where


def test_fsdp4_checkpoint_resumes_on_two_ddp_ranks_with_every_token_once(
    runs_root, seed_checkpoint, fsdp4_run
) -> None:
    dump = runs_root / "fsdp4_to_ddp2"
    shutil.copytree(fsdp4_run / "checkpoint", dump / "checkpoint")
    shutil.rmtree(dump / "checkpoint" / "step-6")  # resume from step 4
    args = _args(seed_checkpoint, local_batch=2, replicate=2, shard=1)
    output = train(dump, args, nproc=2, rows_dir=dump / "rows")
    assert "Applied DDP" in output and "Training starts at step 5" in output

    consumed = _recorded(fsdp4_run / "rows", steps=4) + _recorded(dump / "rows")
    assert len(consumed) == 4 * STEPS
    assert len(set(consumed)) == len(consumed), "a row was trained on twice"
    where = _lane_rows(rows_per_lane=STEPS)
    per_lane: dict[int, list[int]] = {}
    for digest in consumed:
        assert digest in where, "a row that is not among the lanes' first rows: rows were skipped"
        lane, index = where[digest]
        per_lane.setdefault(lane, []).append(index)
    for lane, indices in per_lane.items():
        assert sorted(indices) == list(range(len(indices))), f"lane {lane} skipped rows: {sorted(indices)}"
