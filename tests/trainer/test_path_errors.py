"""A path the config names that cannot be used is one line naming the setting, the path and what was
expected, with exit code 2: in one process, and through the launcher with 2 ranks (its check runs once
before torchrun). Eval and export name their bad checkpoints the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.helpers import BASE_ARGS, DEBUG_CONFIG, LAUNCHER, REPO
from titan_delta.train import EXIT_CONFIG_ERROR, build_args, main, one_line
from titan_delta.trainer import setup_torchtitan
from titan_delta.trainer.checkpoint import mark_complete
from titan_delta.trainer.config_checks import ConfigError
from titan_delta.trainer.path_checks import check_paths

# {case: (trainer arguments, the message); TMP stands for the test's temporary folder}
CASES = {
    "source": (
        ["--data.sources", "TMP/missing.parquet"],
        "[data] sources: TMP/missing.parquet: file not found",
    ),
    "tokenizer": (
        ["--data.tokenizer", "TMP/missing.tiktoken"],
        "[data] tokenizer: TMP/missing.tiktoken: file not found (expected a .tiktoken",
    ),
    "pretokenized": (
        ["--data.pretokenized", "TMP/shards"],
        "[data] pretokenized: TMP/shards: folder not found (expected a folder written by tools/pretokenize",
    ),
    "checkpoint": (
        ["--checkpoint.enable", "--checkpoint.initial_load_path", "TMP/seed/step-0"],
        "[checkpoint] initial_load_path: TMP/seed/step-0: folder not found (expected a DCP step-N",
    ),
    "eval_task": (
        ["--eval.enable", "--eval.tasks", "local,TMP/my_task.yaml"],
        "[eval] tasks: TMP/my_task.yaml: file not found (expected a shipped task",
    ),
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "PREFLIGHT")}
    return env | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def _only_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == EXIT_CONFIG_ERROR and len(lines) == 1, (proc.returncode, proc.stdout[-3000:])
    return lines[0]


@pytest.mark.parametrize("case", CASES)
def test_missing_path_is_one_config_error_line(case: str, tmp_path: Path, capfd: pytest.CaptureFixture):
    """The entry point's checks, in this process (the subprocess test below covers whole processes)."""
    args, message = ([a.replace("TMP", str(tmp_path)) for a in CASES[case][0]], CASES[case][1])
    dump = tmp_path / "dump"
    assert main(["--check_only", *BASE_ARGS, "--job.dump_folder", str(dump), *args]) == EXIT_CONFIG_ERROR
    out, err = capfd.readouterr()
    errors = [line for line in (out + err).splitlines() if "Config error:" in line]
    assert len(errors) == 1 and f"Config error: {message.replace('TMP', str(tmp_path))}" in errors[0]
    assert not dump.exists()  # stopped before anything was built


def test_direct_run_and_launcher_print_only_the_line(tmp_path: Path) -> None:
    """The direct run and the launcher (NGPU=2, CPU) run side by side: each prints only the error."""
    args, message = ([a.replace("TMP", str(tmp_path)) for a in CASES["source"][0]], CASES["source"][1])
    train_args = [*BASE_ARGS, "--job.dump_folder", str(tmp_path / "dump"), *args]
    runs = [
        ([sys.executable, "-m", "titan_delta.train", *train_args], _env()),
        (["bash", str(LAUNCHER), *train_args], _env(NGPU="2", CONFIG=str(DEBUG_CONFIG))),
    ]
    procs = [
        subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd, env in runs
    ]
    for proc, (cmd, _) in zip(procs, runs, strict=True):
        out, _ = proc.communicate(timeout=120)
        line = _only_line(subprocess.CompletedProcess(cmd, proc.returncode, out))
        assert f"Config error: {message.replace('TMP', str(tmp_path))}" in line
    assert not (tmp_path / "dump").exists()  # stopped before anything was built


def test_unreadable_data_file_at_runtime_is_one_line(tmp_path: Path) -> None:
    """The up-front checks see that the file exists; reading it fails inside the trainer, still one line."""
    (tmp_path / "notes.parquet").write_text("not parquet")
    cmd = [sys.executable, "-m", "titan_delta.train", *BASE_ARGS, "--job.dump_folder", str(tmp_path / "d"),
           "--data.sources", str(tmp_path / "notes.parquet")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120)  # fmt: skip
    errors = [line for line in proc.stdout.splitlines() if " ERROR " in line]
    assert proc.returncode == EXIT_CONFIG_ERROR and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert len(errors) == 1 and f"{tmp_path}/notes.parquet: cannot read it as parquet" in errors[0]


def test_loader_worker_errors_are_reduced_to_their_last_line() -> None:
    from titan_delta.data.config import DataConfigError

    wrapped = DataConfigError(
        "Caught DataConfigError in DataLoader worker process 0.\n"
        "Original Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "titan_delta.data.config.DataConfigError: [data] sources: a.parquet: bad\n"
    )
    assert one_line(wrapped) == "[data] sources: a.parquet: bad"
    assert one_line(FileNotFoundError("x\nFileNotFoundError: [Errno 2] y")) == "[Errno 2] y"
    assert one_line(ValueError("plain")) == "plain"


def test_check_only_stops_after_the_checks(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    dump = tmp_path / "dump"
    args = ["--check_only", *BASE_ARGS, "--job.dump_folder", str(dump)]
    assert main(args) == 0 and not dump.exists()
    assert main([*args, "--data.sources", str(tmp_path / "x.jsonl")]) == EXIT_CONFIG_ERROR


def _config(*overrides: str):
    """The debug config with ``overrides``; its dump folder is one that never exists unless overridden."""
    from torchtitan.config import ConfigManager

    setup_torchtitan()
    args = [*BASE_ARGS, "--job.dump_folder", str(REPO / "outputs" / "no-such-run"), *overrides]
    return ConfigManager().parse_args(build_args(args))


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        check_paths(_config(*overrides))
    return str(err.value)


def _step(folder: Path, step: int, complete: bool = True) -> Path:
    path = folder / f"step-{step}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"meta")
    if complete:
        mark_complete(str(path), step, {"files": {".metadata": 4}})
    return path


def test_sources_tokenizer_and_shards(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    check_paths(_config("--data.sources", f"jsonl:{tmp_path}/*.jsonl,hf:org/name?name=x"))  # hub: not fetched
    message = _error("--data.sources", f"{tmp_path}/*.parquet")
    assert message == f"[data] sources: {tmp_path}/*.parquet: no file matches (expected parquet files)"
    assert "expected 'default', 'hf:OWNER/NAME" in _error("--data.sources", f"{tmp_path}/a.csv")
    (tmp_path / "ranks.tiktoken").write_text("not-base64 x\n")
    assert "expected 'base64-token rank'" in _error("--data.tokenizer", str(tmp_path / "ranks.tiktoken"))
    assert "unknown tokenizer 'bogus'" in _error("--data.tokenizer", "bogus")
    shards = tmp_path / "shards"
    shards.mkdir()
    message = _error("--data.pretokenized", str(shards))
    assert message.endswith(f"{shards}: no index.json (expected a folder written by tools/pretokenize.py)")
    index = {"shards": [{"tokens": "tokens_00000.bin", "docs": "d.npy"}]}
    (shards / "index.json").write_text(json.dumps(index))
    assert f"{shards}/tokens_00000.bin: file not found (listed in index.json)" in _error(
        "--data.pretokenized", str(shards)
    )


def test_checkpoints_to_load(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    seeds = tmp_path / "seed"
    _step(seeds, 0)
    _step(seeds, 3)
    check_paths(_config("--checkpoint.enable", "--checkpoint.initial_load_path", str(seeds / "step-0")))
    message = _error("--checkpoint.enable", "--checkpoint.initial_load_path", str(seeds))
    assert f"{seeds}: no .metadata (expected a DCP step-N" in message and f"e.g. {seeds}/step-3" in message
    torn = _step(seeds, 5)
    (torn / ".metadata").write_bytes(b"m")  # the marker recorded 4 bytes
    message = _error("--checkpoint.enable", "--checkpoint.initial_load_path", str(torn))
    assert message.endswith("incomplete checkpoint: .metadata has 1 bytes, 4 were written")
    message = _error("--checkpoint.no-enable", "--checkpoint.initial_load_path", str(seeds / "step-0"))
    assert message == "[checkpoint] initial_load_path is set: it needs [checkpoint] enable = true"
    # a run that already has checkpoints resumes from them and never reads initial_load_path
    _step(dump / "checkpoint", 2)
    ours = ["--checkpoint.enable", "--job.dump_folder", str(dump)]
    check_paths(_config(*ours, "--checkpoint.initial_load_path", str(tmp_path / "gone")))
    message = _error(*ours, "--checkpoint.load_step", "4")
    assert message.startswith(f"[checkpoint] load_step = 4: {dump}/checkpoint/step-4: folder not found")


def test_unknown_eval_task_names(monkeypatch: pytest.MonkeyPatch) -> None:
    import titan_delta.eval.harness as harness

    class Index:  # lm-eval's TaskManager, as far as the check uses it
        all_tasks = ("arc_easy", "mmlu")

    monkeypatch.setattr(harness, "task_manager_for", lambda names: Index())
    check_paths(_config("--eval.enable", "--eval.tasks", "local,paper,mmlu"))
    message = _error("--eval.enable", "--eval.tasks", "titan_delta_tiny_mcq")
    assert message.startswith("[eval] tasks: 'titan_delta_tiny_mcq': unknown task (did you mean 'titan_delta")
    assert "'local', 'paper', an lm-eval task, group or tag name, or a task YAML file" in message
    check_paths(_config("--eval.no-enable", "--eval.tasks", "no_such_task"))  # not run, not checked


def test_eval_and_export_name_a_missing_checkpoint(tmp_path: Path) -> None:
    runs = {
        "eval": [sys.executable, "-m", "titan_delta.eval", "--checkpoint", str(tmp_path / "gone"), "--tasks",
                 "local"],
        "export": [sys.executable, "tools/export_checkpoint.py", "--checkpoint", str(tmp_path / "gone"),
                   "--config", str(DEBUG_CONFIG), "--out", str(tmp_path / "out")],
    }  # fmt: skip
    procs = {
        name: subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        for name, cmd in runs.items()
    }  # fmt: skip
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        lines = [line for line in out.splitlines() if line.strip() and not line.startswith("INFO ")]
        assert proc.returncode == 2 and len(lines) == 1, (name, out[-3000:])
        assert f"--checkpoint {tmp_path}/gone: not a folder" in lines[0]


def test_export_names_an_unwritable_out_and_a_missing_shard(tmp_path: Path, capsys) -> None:
    import torch.distributed.checkpoint as dcp

    from titan_delta.hf.export_cli import main as export_main
    from titan_delta.models.flavors import build_model

    step = tmp_path / "step-1"
    dcp.save(build_model("deltaformer", "debug", vocab_size=16384).state_dict(), checkpoint_id=str(step))
    mark_complete(str(step), 1)  # a marker without a file list, as older saves wrote it
    (tmp_path / "taken").write_text("a file, not a folder")
    assert (
        export_main(
            ["--checkpoint", str(step), "--config", str(DEBUG_CONFIG), "--out", str(tmp_path / "taken")]
        )
        == 2
    )
    assert f"--out {tmp_path}/taken: cannot write the export" in capsys.readouterr().err
    (next(step.glob("*.distcp"))).unlink()
    args = ["--checkpoint", str(step), "--config", str(DEBUG_CONFIG), "--out", str(tmp_path / "out")]
    assert export_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{step}: cannot read the model weights (FileNotFoundError: " in err
