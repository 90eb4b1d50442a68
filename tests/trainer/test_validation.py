"""``[validation]``: held-out loss and bits per byte during training, identical across layouts, and
without any effect on the training trajectory."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.trainer.helpers import DEBUG_CONFIG, from_seed, parsed_debug_config, scalars, train
from titan_delta.trainer import registered_families
from titan_delta.trainer.config_checks import ConfigError, check_job_config
from titan_delta.trainer.path_checks import check_paths
from titan_delta.trainer.validation import HeldOutValidator

LOSS = "loss_metrics/global_avg_loss"
RUN = ["--training.steps", "4", "--training.local_batch_size", "2", "--checkpoint.interval", "3"]


@pytest.fixture(scope="module")
def held_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("held_out") / "held_out.jsonl"
    with path.open("w") as f:
        for i in range(40):
            text = f"Held-out document {i}: rivers, mountains and the sea; naïve café. " * 3
            f.write(json.dumps({"text": text}) + "\n")
    return path


def _validation(held_out: Path, local_batch: int) -> list[str]:
    return [
        "--validation.enable", "--validation.freq", "2", "--validation.steps", "2",
        "--validation.local_batch_size", str(local_batch), "--validation.dataset_path", f"jsonl:{held_out}",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def single(tmp_path_factory, seed_checkpoint: Path, held_out: Path) -> Path:
    """One process, 2 accumulation micro-batches: the rows of FSDP x 2 with local batch 2."""
    dump = tmp_path_factory.mktemp("validation_single")
    args = [*from_seed(seed_checkpoint), *RUN, "--training.global_batch_size", "4"]
    train(dump, [*args, *_validation(held_out, local_batch=4)])
    return dump


def test_logged_every_freq_steps_without_changing_training(tmp_path, seed_checkpoint, held_out, single):
    loss, bpb = scalars(single, "validation/loss"), scalars(single, "validation/bpb")
    assert sorted(loss) == sorted(bpb) == [2, 4]
    assert all(math.isfinite(v) and v > 0 for v in [*loss.values(), *bpb.values()])
    plain = tmp_path / "plain"
    train(plain, [*from_seed(seed_checkpoint), *RUN, "--training.global_batch_size", "4"])
    assert scalars(plain, LOSS) == scalars(single, LOSS)
    assert not scalars(plain, "validation/loss")


def test_every_freq_steps_and_the_last():
    config = SimpleNamespace(validation=SimpleNamespace(freq=3), training=SimpleNamespace(steps=8))
    validator = SimpleNamespace(job_config=config)
    assert [s for s in range(1, 9) if HeldOutValidator.should_validate(validator, s)] == [3, 6, 8]


def test_fsdp_matches_single_process_and_saves_after_validation(tmp_path, seed_checkpoint, held_out, single):
    dump = tmp_path / "fsdp"
    output = train(dump, [*from_seed(seed_checkpoint), *RUN, *_validation(held_out, local_batch=2)], nproc=2)
    assert "validation at step 2" in output
    fsdp, reference = scalars(dump, "validation/loss"), scalars(single, "validation/loss")
    assert sorted(fsdp) == [2, 4]
    for step, value in reference.items():
        assert fsdp[step] == pytest.approx(value, rel=1e-5)
    # step 3 is the first save after the forward-only validation pass of step 2
    for step in (3, 4):
        assert (dump / "checkpoint" / f"step-{step}" / "COMPLETE.json").is_file()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--validation.freq", "0"], "[validation] freq = 0: expected >= 1"),
        (["--validation.local_batch_size", "0"], "[validation] local_batch_size = 0"),
        (["--validation.dataset_path", ""], "[validation] dataset_path is not set"),
    ],
)
def test_bad_validation_keys(overrides: list[str], message: str) -> None:
    enabled = ["--validation.enable", "--validation.dataset_path", "jsonl:x.jsonl"]
    config = parsed_debug_config(*enabled, *overrides)
    with pytest.raises(ConfigError) as err:
        check_job_config(config, registered_families())
    assert message in str(err.value)


def test_steps_rejected_by_torchtitan_is_a_config_error() -> None:
    """torchtitan asserts ``steps > 0 or -1`` while parsing; the entry point reports it as a config error."""
    from titan_delta.train import EXIT_CONFIG_ERROR, main

    args = ["--job.config_file", str(DEBUG_CONFIG), "--validation.enable", "--validation.steps", "0"]
    assert main(args) == EXIT_CONFIG_ERROR


def test_missing_validation_source(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.jsonl"
    config = parsed_debug_config("--validation.enable", "--validation.dataset_path", f"jsonl:{missing}")
    check_job_config(config, registered_families())
    with pytest.raises(ConfigError) as err:
        check_paths(config)
    assert str(err.value) == f"[validation] dataset_path: {missing}: file not found"
