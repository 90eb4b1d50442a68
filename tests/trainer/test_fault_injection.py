"""Faults injected into real multi-process runs (CPU, gloo, torchrun): a kill during an async save, NaN on
one rank, one rank killed mid-step, a save after a scheduled eval. The kill at a random step with a damaged
newest checkpoint is in test_resume.py; the 4-rank cases are in test_fault_injection_4ranks.py."""

from __future__ import annotations

import math
import re
import time

import pytest
import torch.distributed.checkpoint as dcp

from tests.trainer.helpers import STEPS_LONG, checkpointed_fsdp_args, scalars, train, train_until
from titan_delta.trainer.checkpoint import list_checkpoint_dirs

LOSS = "loss_metrics/global_avg_loss"
SHORT_RUN = ["--training.local_batch_size", "2", "--checkpoint.no-enable"]


def assert_same_curves(dump, reference_dump, steps, tb_folder: str = "tb") -> None:
    """Loss, gradient norm and LR of ``steps`` are bitwise the reference run's."""
    for tag in (LOSS, "grad_norm", "lr"):
        got, want = scalars(dump, tag, tb_folder=tb_folder), scalars(reference_dump, tag)
        assert sorted(got) == list(steps), (tag, got)
        for step in steps:
            assert got[step] == want[step], f"{tag} at step {step}: {got[step]} != {want[step]}"


def test_kill_during_an_async_save_resumes_exactly(runs_root, seed_checkpoint, fsdp_run) -> None:
    """The job dies while step 4's async save is being written: step 4 never counts, the resume starts
    from step 2 and the curve is bitwise the uninterrupted run's."""
    reference_dump, _ = fsdp_run
    dump = runs_root / "killed_in_async_save"
    args = [*checkpointed_fsdp_args(seed_checkpoint), "--checkpoint.async_mode", "async"]
    fault = {"kind": "hold_save", "step": 4}
    train_until(dump, args, nproc=2, marker="FAULT: holding the save of step-4", fault=fault)
    dirs = list_checkpoint_dirs(str(dump / "checkpoint"))
    assert [(c.step, c.complete) for c in dirs] == [(2, True), (4, False)]

    output = train(dump, [*args, "--metrics.save_tb_folder", "tb_resumed"], nproc=2)
    assert "Ignoring incomplete checkpoint folders" in output and "step-4 (no COMPLETE.json" in output
    assert "Training starts at step 3" in output
    assert_same_curves(dump, reference_dump, range(3, STEPS_LONG + 1), tb_folder="tb_resumed")
    assert [c.step for c in list_checkpoint_dirs(str(dump / "checkpoint")) if c.complete] == [4, 6]


def _lines(output: str, text: str) -> dict[int, str]:
    """{rank: line} of the lines containing ``text`` (torchrun prefixes each with [rankN]:)."""
    found = {}
    for line in output.splitlines():
        match = re.match(r"\[rank(\d+)\]:", line)
        if match and text in line:
            found[int(match.group(1))] = line
    return found


def test_nan_on_one_rank_is_skipped_on_every_rank(tmp_path) -> None:
    dump = tmp_path / "nan_skip"
    args = [*SHORT_RUN, "--training.steps", "4"]
    output = train(dump, args, nproc=2, fault={"kind": "nan_loss", "rank": 1, "step": 2})
    skipped = _lines(output, "step 2: gradient norm is nan")
    assert sorted(skipped) == [0, 1] and all("skipping this update" in line for line in skipped.values())
    assert scalars(dump, "skipped_steps")[4] == 1
    losses = scalars(dump, LOSS)
    assert math.isnan(losses[2]) and all(math.isfinite(losses[s]) for s in (1, 3, 4)), losses


# The fused optimizer skips the update on the device and the host reads the norm a step late: with
# log_freq 2, step 3's norm is read during step 4, after step 4's forward and backward are queued.
FUSED_UNLOGGED = ["--optimizer.implementation", "fused", "--metrics.log_freq", "2"]


def test_nan_skipped_on_the_device_is_counted_a_step_later(tmp_path) -> None:
    dump = tmp_path / "nan_skip_fused"
    args = [*SHORT_RUN, *FUSED_UNLOGGED, "--training.steps", "4"]
    output = train(dump, args, nproc=2, fault={"kind": "nan_loss", "rank": 1, "step": 3})
    skipped = _lines(output, "step 3: gradient norm is nan")
    assert sorted(skipped) == [0, 1] and all("skipping this update" in line for line in skipped.values())
    assert scalars(dump, "skipped_steps") == {1: 0, 2: 0, 4: 1}  # step 1 is always logged
    losses = scalars(dump, LOSS)
    assert sorted(losses) == [1, 2, 4] and all(math.isfinite(v) for v in losses.values()), losses


def test_a_checkpoint_counts_a_skip_not_yet_read(tmp_path) -> None:
    """Step 2's norm is NaN and not logged; the step-2 checkpoint reads it before saving, so the saved
    count of skipped steps is 1."""
    dump = tmp_path / "nan_checkpoint"
    args = ["--training.local_batch_size", "2", *FUSED_UNLOGGED, "--metrics.log_freq", "3",
            "--training.steps", "3", "--checkpoint.enable", "--checkpoint.interval", "2"]  # fmt: skip
    train(dump, args, fault={"kind": "nan_loss", "rank": 0, "step": 2})
    state = {"train_state": {"skipped_steps": -1}}
    dcp.load(state, checkpoint_id=str(dump / "checkpoint" / "step-2"), no_dist=True)
    assert state["train_state"]["skipped_steps"] == 1


@pytest.mark.parametrize("fused", [False, True])
def test_nan_over_the_limit_stops_every_rank(tmp_path, fused) -> None:
    """Over the limit the run stops before another update: at once with the foreach optimizer, during
    step 4 (before its update is queued) with the fused one."""
    dump = tmp_path / "nan_stop"
    args = [*SHORT_RUN, *(FUSED_UNLOGGED if fused else []), "--training.steps", "4",
            "--nan_policy.max_skipped_steps", "0"]  # fmt: skip
    output = train(dump, args, nproc=2, expect_rc=None, fault={"kind": "nan_loss", "rank": 0, "step": 3})
    stopped = _lines(output, "Training stopped: step 3: gradient norm is nan")
    assert sorted(stopped) == [0, 1], output[-4000:]
    assert "exitcode  : 3" in output  # each worker's own exit code, as torchrun reports it
    assert "step:  4" not in output


def test_a_rank_killed_mid_step_ends_the_job_naming_it(tmp_path) -> None:
    dump = tmp_path / "rank_killed"
    args = [*SHORT_RUN, "--training.steps", "6"]
    started = time.monotonic()
    output = train(dump, args, nproc=2, expect_rc=1, fault={"kind": "kill_rank", "rank": 1, "step": 3})
    assert "FAULT: rank 1 kills itself at step 3" in output
    # torchrun's failure report: one entry per failed rank, "rank : R (local_rank: R)" ... "traceback : ..."
    entries = re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\).*?traceback\s*:\s*([^\n]*)", output, re.S)
    assert any(rank == "1" and "Signal 9 (SIGKILL)" in why for rank, why in entries), output[-3000:]
    assert "step:  3" not in output
    assert time.monotonic() - started < 120  # torchrun stops the survivors; nobody waits for a timeout


def test_saves_after_a_scheduled_eval(tmp_path) -> None:
    """The finding: on 2 FSDP ranks, the first save after an eval failed with KeyError in the optimizer
    state dict (the eval's forward left the root's unsharded parameters registered)."""
    dump = tmp_path / "eval_then_save"
    args = ["--eval.enable", "--eval.interval", "2", "--eval.limit", "1", "--checkpoint.enable",
            "--checkpoint.interval", "2", "--training.steps", "4"]  # fmt: skip
    output = train(dump, args, nproc=2)
    assert "eval at step 2" in output and "KeyError" not in output
    assert [c.step for c in list_checkpoint_dirs(str(dump / "checkpoint")) if c.complete] == [2, 4]
