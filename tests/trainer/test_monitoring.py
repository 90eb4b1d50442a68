"""TensorBoard holds the scalars of every logged step; the NaN/Inf policy skips, then stops by name."""

from __future__ import annotations

import math

from tests.trainer.helpers import scalar_tags, scalars, train
from titan_delta.data import load_tokenizer
from titan_delta.train import EXIT_TRAINING_STOPPED

EXPECTED_TAGS = {
    "loss_metrics/global_avg_loss",
    "loss_metrics/global_max_loss",
    "grad_norm",
    "lr",
    "throughput(tps)",
    "tflops",
    "mfu(%)",
    "memory/max_reserved(GiB)",
    "memory/max_active(GiB)",
    "time_metrics/data_loading(s)",
    "time_metrics/data_loading(%)",
    "time_metrics/end_to_end(s)",
    "skipped_steps",
    "n_tokens_seen",
}


def test_tensorboard_scalars_and_vocab_from_tokenizer(single_run) -> None:
    dump, output = single_run
    vocab = load_tokenizer().get_vocab_size()
    assert f'"vocab_size": {vocab}' in output  # the model was built with the tokenizer's vocabulary
    assert scalar_tags(dump) >= EXPECTED_TAGS
    assert sorted(scalars(dump, "lr")) == [1, 2]
    assert scalars(dump, "n_tokens_seen") == {1: 4 * 64, 2: 8 * 64}
    assert scalars(dump, "skipped_steps") == {1: 0, 2: 0}
    assert all(v > 0 for v in scalars(dump, "throughput(tps)").values())
    assert all(v > 0 for v in scalars(dump, "memory/max_reserved(GiB)").values())
    assert all(math.isnan(v) for v in scalars(dump, "mfu(%)").values())  # no meaningful CPU peak


def test_nonfinite_steps_are_skipped_then_training_stops(tmp_path) -> None:
    """An absurd LR blows the weights up after step 1; from then on every gradient norm is NaN."""
    dump = tmp_path / "nan"
    args = [
        "--optimizer.lr", "1e30",
        "--lr_scheduler.warmup_steps", "0",
        "--training.local_batch_size", "2",
        "--training.steps", "8",
        "--nan_policy.max_skipped_steps", "2",
    ]  # fmt: skip
    output = train(dump, args, expect_rc=EXIT_TRAINING_STOPPED)
    assert "step 2: gradient norm is nan" in output and "skipping this update (1/2" in output
    assert "step 3: gradient norm is nan" in output and "skipping this update (2/2" in output
    assert "Training stopped: step 4: gradient norm is nan" in output
    assert "exceed [nan_policy] max_skipped_steps = 2" in output
    assert scalars(dump, "skipped_steps") == {1: 0, 2: 1, 3: 2}
