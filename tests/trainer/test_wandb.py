"""Weights & Biases beside TensorBoard, offline: training scalars and scheduled-eval scalars reach the run.

The offline run file (``run-ID.wandb``) is read back record by record: W&B's LevelDB-style log of
``wandb_internal_pb2.Record`` protobufs (a 7-byte header, then 32 KiB blocks of checksum/length/type
framed chunks)."""

from __future__ import annotations

import glob
import json
import struct
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.trainer.helpers import scalars, train
from titan_delta.trainer.config_checks import ConfigError
from titan_delta.trainer.metrics import build_metric_logger

BLOCK, HEADER, CHUNK = 32768, 7, 7
FULL, LAST = 1, 4


def wandb_records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, pending, pos = [], b"", HEADER
    while pos + CHUNK <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK])
        if pos + CHUNK + length > len(data):  # a chunk still being written
            break
        pending += data[pos + CHUNK : pos + CHUNK + length]
        pos += CHUNK + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def finished_run(pattern: str, timeout_s: float = 60.0) -> list[Any]:
    """The records of the one run file matching ``pattern``, once its final (``exit``) record is there: the
    W&B service process may still be writing after ``wandb.finish`` returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        paths = glob.glob(pattern)
        assert len(paths) <= 1, paths
        records = wandb_records(Path(paths[0])) if paths else []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, (
            f"no finished W&B run at {pattern}: {paths}, {len(records)} records"
        )
        time.sleep(0.2)


def history(records: list[Any]) -> dict[int, dict[str, Any]]:
    """{step: {key: value}} of every ``wandb.log`` call."""
    rows: dict[int, dict[str, Any]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            rows.setdefault(record.history.step.num, {}).update(items)
    return rows


def run_record(records: list[Any]) -> Any:
    return next(r.run for r in records if r.WhichOneof("record_type") == "run")


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline W&B with every W&B folder in the test's temporary folder and no inherited run settings."""
    pytest.importorskip("wandb", reason="wandb is the optional 'wandb' extra")
    for name in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RUN_NAME", "WANDB_TEAM", "WANDB_ENTITY",
                 "WANDB_RESUME", "WANDB_RUN_GROUP", "WANDB_TAGS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))


def test_training_and_eval_scalars_reach_wandb(tmp_path: Path, offline_wandb: None, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_RUN_TAGS", "ci, tiny")
    # the eval's datasets cache is this test's own, offline (as in tests/eval/conftest.py)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
    dump = tmp_path / "run"
    args = [
        "--training.steps", "2", "--checkpoint.no-enable", "--metrics.enable_wandb",
        "--eval.enable", "--eval.interval", "2", "--eval.limit", "2",
    ]  # fmt: skip
    output = train(dump, args)
    assert "W&B logging enabled: project titan-delta" in output, output[-6000:]
    assert "eval at step 2 (" in output, output[-6000:]  # the scheduled eval ran (it only warns on failure)
    records = finished_run(f"{dump}/tb/*/wandb/offline-run-*/run-*.wandb")  # under the dump folder
    run = run_record(records)
    assert run.project == "titan-delta" and list(run.tags) == ["ci", "tiny"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["training"]["steps"] == 2 and config["metrics"]["enable_wandb"] is True  # the job config
    rows = history(records)
    assert sorted(rows) == [1, 2]
    tensorboard_lr, tensorboard_loss = scalars(dump, "lr"), scalars(dump, "loss_metrics/global_avg_loss")
    for step in (1, 2):
        row = rows[step]
        assert row["lr"] == pytest.approx(tensorboard_lr[step])  # the same scalars as TensorBoard's
        assert row["loss_metrics/global_avg_loss"] == pytest.approx(tensorboard_loss[step], rel=1e-6)
        assert row["n_tokens_seen"] == step * 4 * 64
        assert {"grad_norm", "throughput(tps)", "skipped_steps", "memory/max_reserved(GiB)"} <= row.keys()
    evals = {key: value for key, value in rows[2].items() if key.startswith("eval/")}
    assert "eval/titan_delta_tiny_mc/acc" in evals and len(evals) >= 4
    assert not any(key.startswith("eval/") for key in rows[1])
    results = [json.loads(line) for line in (dump / "eval" / "results.jsonl").read_text().splitlines()]
    assert evals["eval/titan_delta_tiny_mc/acc"] == next(
        r["metrics"]["acc"] for r in results if r["task"] == "titan_delta_tiny_mc"
    )


def _job_config(tmp_path: Path, **metrics: Any) -> SimpleNamespace:
    settings = {"enable_tensorboard": False, "enable_wandb": True, "save_for_all_ranks": False,
                "save_tb_folder": "tb", **metrics}  # fmt: skip
    return SimpleNamespace(
        metrics=SimpleNamespace(**settings),
        job=SimpleNamespace(dump_folder=str(tmp_path / "dump")),
        fault_tolerance=SimpleNamespace(enable=False),
        to_dict=lambda: {"metrics": settings},
    )


def test_wandb_dir_and_tags_in_process(tmp_path: Path, offline_wandb: None, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    monkeypatch.setenv("WANDB_RUN_TAGS", "a, b ")
    metric_logger = build_metric_logger(_job_config(tmp_path), SimpleNamespace(pp_enabled=False), tag="x")
    assert metric_logger.number_of_loggers == 1, "wandb.init failed (see the captured log)"
    try:
        metric_logger.log({"lr": 0.5, "eval/t/acc": 1.0}, step=3)
    finally:
        metric_logger.close()
    records = finished_run(f"{tmp_path}/elsewhere/wandb/offline-run-*/run-*.wandb")  # WANDB_DIR is honoured
    assert not (tmp_path / "dump").exists()
    run = run_record(records)
    assert run.project == "mine" and list(run.tags) == ["a", "b"]
    row = history(records)[3]
    assert (row["x/lr"], row["x/eval/t/acc"]) == (0.5, 1.0)  # the tag prefixes every key, as in torchtitan


def test_missing_wandb_is_a_config_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"^\[metrics\] enable_wandb = true needs the wandb package"):
        build_metric_logger(_job_config(tmp_path), SimpleNamespace(pp_enabled=False))
    # TensorBoard alone needs no wandb
    config = _job_config(tmp_path, enable_wandb=False, enable_tensorboard=True)
    metric_logger = build_metric_logger(config, SimpleNamespace(pp_enabled=False))
    assert metric_logger.number_of_loggers == 1
    metric_logger.close()
