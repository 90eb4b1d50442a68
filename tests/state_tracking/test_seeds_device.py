"""Device choice, precision, time caps, LR schedules and several seeds: the runner's GPU-facing logic,
checked on CPU (plus one GPU-only check that the training step never synchronises the host)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from titan_delta.state_tracking import config_from_dict, load_config, run_experiment, run_seeds
from titan_delta.state_tracking.cli import main
from titan_delta.state_tracking.config import TrainingConfig
from titan_delta.state_tracking.modeling import build_task_model
from titan_delta.state_tracking.runtime import batch_to_device, resolve_device
from titan_delta.state_tracking.seeds import SEEDS_SCHEMA
from titan_delta.state_tracking.tasks import build_task
from titan_delta.state_tracking.trainer import build_optimizer, lr_factor, train_step

QUICK = {
    "task": {"name": "parity"},
    "model": {"mixer": "attention", "dim": 16, "n_heads": 2},
    "training": {"steps": 6, "batch_size": 8, "warmup_steps": 2},
    "curriculum": {"start_length": 4, "final_length": 4, "eval_every": 3, "eval_sequences": 16},
    "eval": {"lengths": [4, 8], "sequences": 16},
    "output": {"progress": False},
}  # fmt: skip


def quick_config(**sections: dict):
    data = {name: dict(values) for name, values in QUICK.items()}
    for name, values in sections.items():
        data[name].update(values)
    return config_from_dict(data)


def test_auto_picks_cuda_only_when_a_gpu_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda") and resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"training\.device='cuda' but no CUDA device"):
        resolve_device("cuda")


def test_cpu_batches_are_not_pinned_or_moved() -> None:
    batch = build_task("parity").sample(4, 2, np.random.default_rng(0))
    moved = batch_to_device(batch, torch.device("cpu"))
    assert moved.inputs.data_ptr() == batch.inputs.data_ptr() and not moved.inputs.is_pinned()


def test_cosine_schedule_warms_up_then_decays_to_zero() -> None:
    factor = lr_factor(TrainingConfig(steps=12, warmup_steps=2, schedule="cosine"))
    assert [factor(0), factor(1)] == [0.5, 1.0]
    assert factor(2) == 1.0 and math.isclose(factor(7), 0.5) and factor(12) == 0.0
    assert lr_factor(TrainingConfig(steps=12, warmup_steps=0))(11) == 1.0  # constant by default


def test_time_limit_cuts_a_run_short_and_still_evaluates() -> None:
    report = run_experiment(quick_config(training={"time_limit_s": 1e-6, "steps": 50}), log=lambda _: None)
    training = report["training"]
    assert training["steps_run"] == 1 and training["stopped_by"] == "time_limit" and training["cut_short"]
    assert [row["length"] for row in report["eval"]] == [4, 8]
    uncut = run_experiment(quick_config(), log=lambda _: None)["training"]
    assert uncut["steps_run"] == 6 and not uncut["cut_short"]


def test_bf16_autocast_runs_and_is_recorded() -> None:
    report = run_experiment(quick_config(training={"precision": "bf16"}), log=lambda _: None)
    assert report["precision"] == "bf16" and math.isfinite(report["training"]["final_loss"])


def test_several_seeds_report_each_run_and_their_mean() -> None:
    config = quick_config(training={"seeds": [3, 5]})
    report = run_seeds(config, log=lambda _: None)
    assert report["schema"] == SEEDS_SCHEMA and report["seeds"] == [3, 5] and report["device"] == "cpu"
    assert [run["seed"] for run in report["runs"]] == [3, 5]
    alone = run_experiment(quick_config(training={"seed": 5}), log=lambda _: None)
    assert report["runs"][1]["eval"] == alone["eval"]  # each seed runs exactly as it would alone
    assert report["runs"][1]["training"]["final_loss"] == alone["training"]["final_loss"]
    for i, row in enumerate(report["mean"]["eval"]):
        values = [run["eval"][i]["token_accuracy"] for run in report["runs"]]
        assert math.isclose(row["token_accuracy"]["mean"], sum(values) / 2)
        assert row["token_accuracy"]["min"] == min(values) and row["token_accuracy"]["max"] == max(values)
    assert report["mean"]["training"]["final_train_lengths"] == [4, 4]
    with pytest.raises(ValueError, match=r"training\.seeds=\[3, 5\] asks for several runs"):
        run_experiment(config)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("training.precision=fp16", "training.precision"),
        ("training.schedule=linear", "training.schedule"),
        ("training.betas=[0.9]", "training.betas"),
        ("training.seeds=[1, 1]", "training.seeds"),
        ("training.seeds=[-1]", "training.seeds"),
        ("training.seeds=2", "training.seeds"),
    ],
)
def test_bad_training_settings_name_their_key(override: str, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_cli_seeds_and_combine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, suite = tmp_path / "seeds.json", tmp_path / "suite.json"
    args = ["--task.name=parity", "--model.dim=16", "--training.steps=2", "--training.batch_size=4"]
    args += ["--curriculum.final_length=4", "--eval.lengths=[4]", "--eval.sequences=8", "--device", "cpu"]
    assert main([*args, "--seeds", "0,1", "--no-progress", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["seeds"] == [0, 1] and len(report["runs"]) == 2 and report["mean"]["runs"] == 2
    assert "| 0,1 |" in capsys.readouterr().out
    assert main(["--summarize", str(out), "--combine", str(suite)]) == 0
    combined = json.loads(suite.read_text())
    assert combined["reports"] == [report]
    assert main(["--summarize", str(suite)]) == 0  # a suite file expands into its reports
    with pytest.raises(SystemExit, match="--seeds expects"):
        main([*args, "--seeds", "0,x"])


@pytest.mark.gpu
@pytest.mark.parametrize("mixer", ["attention", "deltaformer", "gated_deltaproduct"])
def test_training_steps_never_synchronise_the_host(mixer: str) -> None:
    config = quick_config(model={"mixer": mixer, "dim": 64}, training={"device": "cuda", "precision": "bf16"})
    device = torch.device("cuda")
    task = build_task("parity")
    model = build_task_model(config.model, task.vocab_size, 64).to(device)
    optimizer = build_optimizer(model, config, device)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(config.training))
    rng = np.random.default_rng(0)
    train_step(
        model, batch_to_device(task.sample(32, 8, rng), device), optimizer, schedule, config.training, device
    )
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside the steps below raises
    try:
        for _ in range(3):
            batch = batch_to_device(task.sample(32, 8, rng), device)
            loss = train_step(model, batch, optimizer, schedule, config.training, device)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert math.isfinite(float(loss))
