"""Scheduled evals: TensorBoard scalars + JSONL, training state untouched, failures never raise."""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest
import torch

from titan_delta.eval import EvalConfig, ScheduledEvaluator

from .helpers import HYBRID, tiny_model


class RecordingWriter:
    """SummaryWriter stand-in that keeps every add_scalar call."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))


def _rng_draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_config_validation_names_the_field() -> None:
    cases = [
        ({"interval": -1}, "interval"), ({"limit": 2.5}, "limit"), ({"batch_size": 0}, "batch_size"),
        ({"num_fewshot": -2}, "num_fewshot"), ({"tasks": "piqa"}, "tasks"),
        ({"results_file": "/abs.jsonl"}, "results_file"),
    ]  # fmt: skip
    for bad, field in cases:
        with pytest.raises(ValueError, match=rf"\[eval\] {field}"):
            EvalConfig(**bad).validate()
    assert EvalConfig(limit=0.5).limit_arg == 0.5 and EvalConfig(limit=3).limit_arg == 3
    assert EvalConfig().limit_arg is None


def test_schedule() -> None:
    evaluator = ScheduledEvaluator(EvalConfig(enable=True, interval=10), None, "unused")
    assert [s for s in range(1, 31) if evaluator.due(s)] == [10, 20, 30]
    assert evaluator.due(35, last_step=True)
    assert not ScheduledEvaluator(EvalConfig(enable=False, interval=1), None, "x").due(5, last_step=True)
    assert not ScheduledEvaluator(EvalConfig(enable=True, at_end=False), None, "x").due(5, last_step=True)


def test_scheduled_eval_logs_and_leaves_training_state_alone(tmp_path, tokenizer, caplog) -> None:
    model = tiny_model(torch.float32, vocab_size=16384, **HYBRID).train()
    model.layers["1"].mlp.eval()  # a submodule deliberately in eval mode must stay so
    writer = RecordingWriter()
    config = EvalConfig(
        enable=True, interval=5, limit=3,
        tasks=["titan_delta_tiny_mc", "no_such_task_xyz", "titan_delta_tiny_ppl", "titan_delta_tiny_gen"],
    )  # fmt: skip
    evaluator = ScheduledEvaluator(config, tokenizer, str(tmp_path), metric_logger=writer)

    seed_state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    expected_draws = _rng_draws()
    random.setstate(seed_state[0]), np.random.set_state(seed_state[1]), torch.set_rng_state(seed_state[2])
    assert evaluator.maybe_run(3, 300, model) is None  # not due: nothing happens
    with caplog.at_level(logging.WARNING):
        metrics = evaluator.maybe_run(5, torch.tensor(500), model)
    assert _rng_draws() == expected_draws  # lm-eval reseeded every RNG; all were restored
    assert model.training and not model.layers["1"].mlp.training and model.layers["0"].mlp.training
    assert "no_such_task_xyz" in caplog.text

    assert metrics is not None and set(metrics) == {
        "titan_delta_tiny_mc",
        "titan_delta_tiny_ppl",
        "titan_delta_tiny_gen",
    }
    tags = {tag for tag, _, step in writer.scalars if step == 5}
    assert {
        "eval/titan_delta_tiny_mc/acc", "eval/titan_delta_tiny_mc/acc_norm",
        "eval/titan_delta_tiny_ppl/word_perplexity", "eval/titan_delta_tiny_gen/exact_match",
    } <= tags  # fmt: skip
    lines = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    assert {line["task"] for line in lines} == set(metrics) | {"no_such_task_xyz"}
    good = next(line for line in lines if line["task"] == "titan_delta_tiny_mc")
    assert good["step"] == 5 and good["tokens_seen"] == 500 and 0.0 <= good["metrics"]["acc"] <= 1.0
    assert "error" in next(line for line in lines if line["task"] == "no_such_task_xyz")

    assert evaluator.maybe_run(5, 500, model) is None  # one eval per step, however often it is asked


def test_failing_eval_warns_and_training_goes_on(tmp_path, tokenizer, caplog) -> None:
    class Broken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = tiny_model(torch.float32, vocab_size=16384, n_layers=1)
            self.model_args = self.inner.model_args

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom in forward")

    model = Broken().train()
    config = EvalConfig(enable=True, interval=1, limit=2, tasks=["titan_delta_tiny_mc"])
    evaluator = ScheduledEvaluator(config, tokenizer, str(tmp_path), metric_logger=RecordingWriter())
    before = torch.get_rng_state()
    with caplog.at_level(logging.WARNING):
        assert evaluator.maybe_run(1, 10, model) is None
    assert "boom in forward" in caplog.text and model.training and torch.equal(before, torch.get_rng_state())


def test_scalars_reach_tensorboard_event_files(tmp_path, tokenizer) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    config = EvalConfig(enable=True, interval=2, limit=2, tasks=["titan_delta_tiny_cloze"])
    model = tiny_model(torch.float32, vocab_size=16384, **HYBRID)
    ScheduledEvaluator(config, tokenizer, str(tmp_path), metric_logger=writer).maybe_run(2, 64, model)
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"eval/titan_delta_tiny_cloze/acc", "eval/titan_delta_tiny_cloze/perplexity"} <= set(
        events.Tags()["scalars"]
    )
    assert events.Scalars("eval/titan_delta_tiny_cloze/acc")[0].step == 2
