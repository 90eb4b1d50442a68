"""The curriculum trainer learns, the CLI writes the documented JSON, NoPE really removes positions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from titan_delta.state_tracking import REPORT_FIELDS, LengthCurriculum, config_from_dict, run_experiment
from titan_delta.state_tracking.cli import main
from titan_delta.state_tracking.config import ModelConfig
from titan_delta.state_tracking.modeling import build_task_model
from titan_delta.state_tracking.report import EVAL_FIELDS

TINY = {
    "task": {"name": "word_problem", "group": "S3"},
    "model": {"mixer": "deltaformer", "dim": 32, "n_heads": 2, "deltaformer_kernel": "linear"},
    "training": {"steps": 60, "batch_size": 32, "lr": 3e-3, "warmup_steps": 5, "seed": 0},
    "curriculum": {
        "start_length": 2, "final_length": 2, "eval_every": 10, "eval_sequences": 64,
        "stop_when_solved": False,
    },
    "eval": {"lengths": [2, 4], "sequences": 128},
    "output": {"progress": False},
}  # fmt: skip


def tiny_config(**section_updates: dict):
    data = {name: dict(values) for name, values in TINY.items()}
    for name, values in section_updates.items():
        data[name].update(values)
    return config_from_dict(data)


def test_a_tiny_run_improves_accuracy() -> None:
    untrained = run_experiment(tiny_config(training={"steps": 1}), log=lambda _: None)
    trained = run_experiment(tiny_config(), log=lambda _: None)
    before, after = untrained["eval"][0], trained["eval"][0]
    assert before["length"] == after["length"] == 2
    assert before["token_accuracy"] < 0.4  # six classes: about chance
    assert after["token_accuracy"] > before["token_accuracy"] + 0.3
    assert after["token_accuracy"] > after["majority_baseline"] + 0.3


def test_cli_writes_the_documented_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    args = ["--task.name=parity", "--model.dim=32", "--training.steps=4", "--training.warmup_steps=1"]
    args += ["--curriculum.start_length=2", "--curriculum.final_length=4", "--curriculum.eval_every=2"]
    args += ["--curriculum.threshold", "0.01", "--eval.lengths=[4, 8]", "--eval.sequences=8"]
    assert main([*args, "--no-progress", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(REPORT_FIELDS) <= set(report)
    assert [row["length"] for row in report["eval"]] == [4, 8]
    for row in report["eval"]:
        assert set(EVAL_FIELDS) <= set(row) and 0.0 <= row["token_accuracy"] <= 1.0
    training = report["training"]
    assert training["stopped_by"] == "solved" and training["solved"]  # threshold 0.01 always passes
    assert report["length_changes"] == [{"step": 2, "from": 2, "to": 4}]
    assert training["final_train_length"] == 4 and training["steps_run"] == 4
    assert [row["beyond_training"] for row in report["eval"]] == [False, True]
    assert report["config"]["task"]["name"] == "parity" and report["model"]["mixers"] == ["deltaformer"]
    assert "| parity |" in capsys.readouterr().out
    assert main(["--summarize", str(out)]) == 0


def test_curriculum_doubles_up_to_the_final_length() -> None:
    curriculum = LengthCurriculum(start_length=3, final_length=10, threshold=0.99)
    assert not curriculum.update(0.98) and curriculum.length == 3
    assert curriculum.update(0.99) and curriculum.length == 6
    assert curriculum.update(1.0) and curriculum.length == 10
    assert not curriculum.solved
    assert not curriculum.update(1.0) and curriculum.solved and curriculum.length == 10


@pytest.mark.parametrize("rope", [True, False])
def test_nope_makes_one_attention_layer_blind_to_order(rope: bool) -> None:
    torch.manual_seed(0)
    args = {"mixer": "attention", "n_layers": 1, "dim": 32, "n_heads": 2, "multiple_of": 16}
    config = ModelConfig(rope=rope, args=args)
    model = build_task_model(config, vocab_size=16, max_tokens=8).double()
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 9]])
    shuffled = torch.tensor([[5, 3, 7, 1, 2, 6, 4, 9]])  # same multiset before the last token
    with torch.no_grad():
        last = [model(t)[0, -1] for t in (tokens, shuffled)]
    gap = float((last[0] - last[1]).abs().max())
    if rope:
        assert gap > 1e-6
    else:
        assert gap < 1e-10


def test_run_label_names_positions_only_for_attention_like_mixers() -> None:
    from titan_delta.state_tracking.report import run_label

    def report(mixer: str, rope: bool, **args) -> dict:
        return {"config": {"model": {"args": {"dim": 128, **args}}},
                "model": {"mixers": [mixer], "rope": rope}, "precision": "bf16"}

    gdp = report("gated_deltaproduct", True, gdp_num_householder=2)
    assert run_label(gdp) == "1L gated_deltaproduct d=128 n_h=2 bf16"
    assert run_label(report("deltaformer", False, deltaformer_kernel="round")).endswith("κ1=round NoPE bf16")
    assert run_label(report("attention", True)) == "1L attention d=128 RoPE bf16"
