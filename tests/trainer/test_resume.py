"""Kill a FSDP×2 run at a random step, leave a torn checkpoint behind and truncate a file of the newest
complete one, resume: the losses and gradient norms of the resumed steps equal the uninterrupted run's,
neither damaged folder is loaded, keep-latest-k holds, and the exported final weights are identical.
Also: a resume with more steps continues the LR schedule instead of restarting it."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from tests.trainer.helpers import DEBUG_CONFIG, checkpointed_fsdp_args, scalars, train, train_until
from titan_delta.hf.export_cli import export
from titan_delta.trainer.checkpoint import COMPLETE_MARKER, list_checkpoint_dirs

LOSS = "loss_metrics/global_avg_loss"


def _fabricate_torn(folder: Path, source_step: int, torn_step: int) -> Path:
    """What a save killed while overwriting an older step-N leaves: the old .metadata, missing shards,
    no completion marker. torchtitan's own rule (".metadata exists") would pick it as the latest."""
    torn = folder / f"step-{torn_step}"
    shutil.copytree(folder / f"step-{source_step}", torn)
    (torn / COMPLETE_MARKER).unlink()
    next(torn.glob("*.distcp")).unlink()
    assert (torn / ".metadata").is_file()
    return torn


def test_kill_and_resume_matches_uninterrupted(runs_root, seed_checkpoint, fsdp_run, tmp_path) -> None:
    reference_dump, _ = fsdp_run
    dump = runs_root / "killed"
    args = checkpointed_fsdp_args(seed_checkpoint)
    kill_step = random.choice([5, 6])
    train_until(dump, args, nproc=2, marker=f"step:  {kill_step}")
    folder = dump / "checkpoint"
    complete = [c.step for c in list_checkpoint_dirs(str(folder)) if c.complete]
    assert complete[:2] == [2, 4], (kill_step, complete)  # step 6 may have finished before the kill
    # the newest complete checkpoint loses bytes of a shard; a save killed mid-write leaves step 5
    shard = next((folder / f"step-{complete[-1]}").glob("*.distcp"))
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-100])
    torn = _fabricate_torn(folder, source_step=2, torn_step=5)
    resume_from = complete[-2]

    output = train(dump, [*args, "--metrics.save_tb_folder", "tb_resumed"], nproc=2)
    assert f"Loading the checkpoint from {folder / f'step-{resume_from}'}" in output, kill_step
    assert f"step-{complete[-1]} ({shard.name} has {size - 100} bytes, {size} were written)" in output
    assert "step-5 (no COMPLETE.json" in output
    assert f"Training starts at step {resume_from + 1}" in output
    resumed_steps = list(range(resume_from + 1, 7))

    for tag in (LOSS, "grad_norm", "lr"):
        resumed = scalars(dump, tag, tb_folder="tb_resumed")
        reference = scalars(reference_dump, tag)
        assert sorted(resumed) == resumed_steps, resumed
        for step in resumed_steps:
            assert resumed[step] == reference[step], (
                f"{tag} at step {step}: {resumed[step]} != {reference[step]}"
            )

    # keep_latest_k = 2 counts complete checkpoints only and deletes torn folders (the reference run
    # saved asynchronously: its markers were written when the background saves finished).
    assert not torn.exists()
    assert [(c.step, c.complete) for c in list_checkpoint_dirs(str(folder))] == [(4, True), (6, True)]
    reference_dirs = list_checkpoint_dirs(str(reference_dump / "checkpoint"))
    assert [(c.step, c.complete) for c in reference_dirs] == [(4, True), (6, True)]

    saved = dcp.FileSystemReader(str(folder / "step-6")).read_metadata().state_dict_metadata
    for key in (
        "train_state.step",
        "train_state.skipped_steps",
        "train_state.rng_cpu",
        "lr_scheduler.last_epoch",
    ):
        assert key in saved, key
    assert any(k.startswith("dataloader.") for k in saved) and any(k.startswith("optimizer.") for k in saved)

    # Exported final weights are identical (and a complete safetensors file of every model weight).
    mine = load_file(Path(export(str(folder), str(DEBUG_CONFIG), str(tmp_path / "a"))) / "model.safetensors")
    ref_out = export(str(reference_dump / "checkpoint"), str(DEBUG_CONFIG), str(tmp_path / "b"))
    theirs = load_file(Path(ref_out) / "model.safetensors")
    assert mine.keys() == theirs.keys() and "tok_embeddings.weight" in mine
    for name, tensor in mine.items():
        assert tensor.equal(theirs[name]), name
    # config.json carries what evaluation needs to frame documents as training did
    described = json.loads((Path(ref_out) / "config.json").read_text())
    assert described["tokenizer"] == "default" and described["add_bos"] is False
    assert described["tokenizer_pattern"] == "" and described["model_name"] == "deltaformer"


def test_resume_with_more_steps_continues_the_lr_schedule(tmp_path) -> None:
    """The finding: a finished 6-step run resumed with 10 steps went from its final LR (2e-4) back to the
    2e-3 peak. Now the LR stays on its decay and one warning line says what changed."""
    dump = tmp_path / "more_steps"
    args = ["--training.steps", "6", "--checkpoint.enable", "--checkpoint.interval", "3"]
    train(dump, args)
    output = train(dump, [*args, "--training.steps", "10", "--metrics.save_tb_folder", "tb_resumed"])
    (line,) = [x for x in output.splitlines() if "LR schedule changed at resume from step 6" in x]
    assert "saved 6 steps" in line and "now 10 steps" in line and "no second warmup" in line
    before, after = scalars(dump, "lr"), scalars(dump, "lr", tb_folder="tb_resumed")
    assert sorted(after) == [7, 8, 9, 10]
    assert before[6] == pytest.approx(2e-4) and all(v == pytest.approx(2e-4) for v in after.values())
