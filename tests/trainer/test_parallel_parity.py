"""Step-1 loss and gradient norm (and step-2 loss) agree across single / FSDP×2 / DDP×2 / HSDP 2×2.

Every run sees the same 4 rows per step (row order differs, the token-mean loss does not) and starts from
the same seed checkpoint, so only the reduction order differs. DDP guards our fix of torchtitan 0.2.2's
double averaging: DDP's mean over ranks on top of the global-token normalisation would halve the
gradient norm here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import from_seed, scalars, train

LOSS = "loss_metrics/global_avg_loss"
# fp32 with different reduction orders. The gradient norm gets a looser bound: torch's CPU norm kernels
# accumulate 1M-element fp32 tensors (embedding, LM head) with ~1e-4 relative error, and FSDP's half-size
# shards round differently (measured: single vs FSDP x2 differ by 9.4e-5, each ~2e-4 from the fp64 norm).
# Averaging the gradients twice under DDP would be off by 50%.
TOLS = {"step-1 loss": 2e-5, "step-1 grad norm": 5e-4, "step-2 loss": 2e-5}


def _first_steps(dump: Path) -> tuple[float, float, float]:
    loss, norm = scalars(dump, LOSS), scalars(dump, "grad_norm")
    return loss[1], norm[1], loss[2]


def _assert_same(name: str, got: tuple[float, ...], ref: tuple[float, ...]) -> None:
    for (label, tol), a, b in zip(TOLS.items(), got, ref, strict=True):
        assert a == pytest.approx(b, rel=tol), f"{name} {label}: {a} vs single-process {b}"


def test_fsdp_matches_single_process(single_run, fsdp_run) -> None:
    _assert_same("FSDP x2", _first_steps(fsdp_run[0]), _first_steps(single_run[0]))
    assert "Applied FSDP" in fsdp_run[1]


def _data_parallel_run(dump: Path, seed_checkpoint: Path, local_batch: int, replicate: int, shard: int,
                       nproc: int) -> str:
    """Two steps from the seed on a (replicate, shard) data-parallel mesh of ``nproc`` processes."""
    args = [
        *from_seed(seed_checkpoint),
        "--training.local_batch_size", str(local_batch),
        "--training.steps", "2",
        "--parallelism.data_parallel_replicate_degree", str(replicate),
        "--parallelism.data_parallel_shard_degree", str(shard),
    ]  # fmt: skip
    return train(dump, args, nproc=nproc)


def test_ddp_matches_single_process(runs_root, seed_checkpoint, single_run) -> None:
    dump = runs_root / "ddp2"
    # replicate degree -1: every rank the shard degree leaves, as the shipped 340M configs ask for DDP
    output = _data_parallel_run(dump, seed_checkpoint, local_batch=2, replicate=-1, shard=1, nproc=2)
    assert "Applied DDP over 2 ranks" in output
    _assert_same("DDP x2", _first_steps(dump), _first_steps(single_run[0]))


@pytest.mark.slow
def test_hsdp_matches_single_process(runs_root, seed_checkpoint, single_run) -> None:
    dump = runs_root / "hsdp"
    output = _data_parallel_run(dump, seed_checkpoint, local_batch=1, replicate=2, shard=2, nproc=4)
    assert "Applied HSDP over mesh (2, 2)" in output
    _assert_same("HSDP 2x2", _first_steps(dump), _first_steps(single_run[0]))
