"""``[model]`` / ``--model.<field>`` override single ModelArgs fields of the flavor: bad keys, types and
values fail the config check; the trained model, its checkpoint, the export and DCP eval all use them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.helpers import DEBUG_CONFIG, REPO, train
from titan_delta.train import EXIT_CONFIG_ERROR, main
from titan_delta.trainer.config import MODEL_ARGS_SET_ELSEWHERE, MODEL_OVERRIDE_FIELDS

# (TOML [model] lines, the same on the command line, what the error says)
BAD_OVERRIDES = [
    pytest.param(
        "gdp_num_houselder = 3", ["--model.gdp_num_houselder", "3"],
        ("unknown key 'gdp_num_houselder' in [model] (did you mean 'gdp_num_householder'?)",
         "--model.gdp-num-householder"),
        id="unknown-field",
    ),
    pytest.param(
        'dim = "wide"', ["--model.dim", "wide"],
        ("[model] dim = 'wide': expected int | none", "invalid literal for int()"),
        id="wrong-type",
    ),
    pytest.param(
        "dim = 65", ["--model.dim", "65"],
        ("[model] dim = 65: dim=65 must be divisible by n_heads=4",) * 2,
        id="indivisible-dim",
    ),
    pytest.param(
        "gdp_num_householder = 0", ["--model.gdp_num_householder", "0"],
        ("[model] gdp_num_householder = 0: gdp_num_householder must be >= 1",) * 2,
        id="zero-householder",
    ),
    pytest.param(
        'layer_pattern = "deltaformer,conv,swa"', ["--model.layer_pattern", "deltaformer,conv,swa"],
        ("[model] layer_pattern = 'deltaformer,conv,swa': layer_pattern: layer 1 has unknown mixer",) * 2,
        id="unknown-mixer",
    ),
]  # fmt: skip


DEBUG_MODEL = '[model]\nname = "deltaformer"\nflavor = "debug"\n'


def _with_model_section(folder: Path, lines: str, name: str = "deltaformer") -> Path:
    """debug.toml with model ``name`` and extra ``[model]`` lines, written into ``folder``."""
    text = DEBUG_CONFIG.read_text()
    assert DEBUG_MODEL in text
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.toml"
    path.write_text(text.replace(DEBUG_MODEL, f'[model]\nname = "{name}"\nflavor = "debug"\n{lines}\n'))
    return path


def _check_only(args: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "titan_delta.train", *args, "--check_only"]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _main_in_process(args: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``titan_delta.train.main`` with ``--check_only``: its exit code (tyro's command-line errors exit
    through SystemExit) and everything it printed."""
    try:
        rc = main([*args, "--check_only"])
    except SystemExit as err:
        rc = err.code if isinstance(err.code, int) else 1
    captured = capfd.readouterr()
    return rc, captured.out + captured.err


def test_every_model_args_field_is_a_model_key() -> None:
    from dataclasses import fields

    from titan_delta.models import ModelArgs

    names = {f.name for f in fields(ModelArgs) if not f.name.startswith("_")}
    assert set(MODEL_OVERRIDE_FIELDS) == names - set(MODEL_ARGS_SET_ELSEWHERE)


@pytest.mark.parametrize("where", ["toml", "cli"])
@pytest.mark.parametrize(("toml_lines", "cli", "messages"), BAD_OVERRIDES)
def test_bad_overrides_exit_2(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    where: str,
    toml_lines: str,
    cli: list[str],
    messages: tuple[str, str],
) -> None:
    # In process: a subprocess per case would spend most of its time importing torch.
    if where == "toml":
        args, message = ["--job.config_file", str(_with_model_section(tmp_path, toml_lines))], messages[0]
    else:
        args, message = ["--job.config_file", str(DEBUG_CONFIG), *cli], messages[1]
    rc, out = _main_in_process(args, capfd)
    assert rc == EXIT_CONFIG_ERROR, out[-3000:]
    assert message in out, out[-3000:]
    errors = [line for line in out.splitlines() if "Config error:" in line]
    if message.startswith("[model]"):  # ours; tyro reports unknown flags and unparsable values itself
        assert len(errors) == 1, out[-3000:]


def test_check_only_subprocess_exit_codes(tmp_path: Path) -> None:
    """The real command line: one bad override on the CLI and one in the TOML exit 2 with one line, a
    good combination passes."""
    bad_toml = _with_model_section(tmp_path, "gdp_num_householder = 0", name="gated_deltaproduct")
    runs = {
        "cli": _check_only(["--job.config_file", str(DEBUG_CONFIG), "--model.dim", "65"]),
        "toml": _check_only(["--job.config_file", str(bad_toml)]),
        "good": _check_only(["--job.config_file", str(DEBUG_CONFIG), "--model.name", "gated_deltaproduct",
                             "--model.gdp_num_householder", "3", "--model.gdp_allow_neg_eigval", "True",
                             "--model.n_layers", "4", "--model.window_size", "32"]),
    }  # fmt: skip
    outputs = {}
    for key, proc in runs.items():
        outputs[key] = (proc.communicate(timeout=240)[0], proc.returncode)
    expected = {
        "cli": "[model] dim = 65: dim=65 must be divisible by n_heads=4",
        "toml": "[model] gdp_num_householder = 0: gdp_num_householder must be >= 1",
    }
    for key, message in expected.items():
        out, rc = outputs[key]
        errors = [line for line in out.splitlines() if "Config error:" in line]
        assert rc == EXIT_CONFIG_ERROR and len(errors) == 1 and message in errors[0], out[-3000:]
    out, rc = outputs["good"]
    assert rc == 0 and "Config check passed" in out, out[-3000:]


def test_toml_list_layer_pattern_and_bool_are_checked_in_process(tmp_path: Path) -> None:
    from titan_delta.train import build_args
    from titan_delta.trainer.config_checks import ConfigError

    ok = _with_model_section(tmp_path / "ok", 'layer_pattern = ["deltaformer", "swa", "attention"]')
    build_args(["--job.config_file", str(ok)])
    bad = _with_model_section(tmp_path / "bad", 'gdp_allow_neg_eigval = "yes"')
    with pytest.raises(ConfigError, match=r"\[model\] gdp_allow_neg_eigval = 'yes': expected bool \| none"):
        build_args(["--job.config_file", str(bad)])
    vocab = _with_model_section(tmp_path / "vocab", "vocab_size = 100")  # the tokenizer's: not a [model] key
    with pytest.raises(ConfigError, match="unknown key 'vocab_size' in \\[model\\]"):
        build_args(["--job.config_file", str(vocab)])


def test_override_trains_checkpoints_exports_and_evaluates(tmp_path: Path) -> None:
    from titan_delta.eval.checkpoint import load_checkpoint
    from titan_delta.hf.export_cli import export
    from titan_delta.models import build_model, count_parameters
    from titan_delta.trainer.checkpoint import COMPLETE_MARKER
    from titan_delta.trainer.dcp_model import CheckpointError

    dump = tmp_path / "run"
    overrides = {"gdp_num_householder": 3, "n_layers": 4, "gdp_allow_neg_eigval": True}
    flags = [arg for key, value in overrides.items() for arg in (f"--model.{key}", str(value))]
    run = ["--training.steps", "2", "--training.local_batch_size", "2", "--checkpoint.enable",
           "--checkpoint.interval", "2", "--metrics.no-enable-tensorboard"]  # fmt: skip
    out = train(dump, ["--model.name", "gated_deltaproduct", *flags, *run])

    step_dir = dump / "checkpoint" / "step-2"
    marker = json.loads((step_dir / COMPLETE_MARKER).read_text())
    assert (marker["model_name"], marker["flavor"]) == ("gated_deltaproduct", "debug")
    recorded = marker["model_args"]
    assert {key: recorded[key] for key in overrides} == overrides and recorded["max_seq_len"] == 64
    expected = build_model("gated_deltaproduct", "debug", vocab_size=recorded["vocab_size"], **overrides)
    logged = re.search(r"size: ([\d,]+) total parameters", out)
    assert logged and int(logged.group(1).replace(",", "")) == count_parameters(expected)
    shapes = {k: tuple(v.shape) for k, v in expected.state_dict().items()}

    # The checkpoint records its model: the plain debug.toml (no overrides) exports and evaluates it.
    exported = export(str(dump), str(DEBUG_CONFIG), str(tmp_path / "export"))
    config = json.loads((Path(exported) / "config.json").read_text())
    assert {key: config["model_args"][key] for key in overrides} == overrides
    assert config["model_name"] == "gated_deltaproduct"
    for loaded in (load_checkpoint(exported), load_checkpoint(str(dump), str(DEBUG_CONFIG))):
        assert {k: tuple(v.shape) for k, v in loaded.model.state_dict().items()} == shapes
        assert loaded.model.model_args.gdp_allow_neg_eigval is True

    # A checkpoint without that record is rebuilt from the TOML's [model] overrides.
    del marker["model_args"], marker["model_name"], marker["flavor"]
    (step_dir / COMPLETE_MARKER).write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match=r"lacks model weights|weight shapes differ"):
        export(str(dump), str(DEBUG_CONFIG), str(tmp_path / "bare"))
    lines = "gdp_num_householder = 3\nn_layers = 4\ngdp_allow_neg_eigval = true"
    toml = _with_model_section(tmp_path / "toml", lines, name="gated_deltaproduct")
    loaded = load_checkpoint(export(str(dump), str(toml), str(tmp_path / "from_toml")))
    assert {k: tuple(v.shape) for k, v in loaded.model.state_dict().items()} == shapes
    assert loaded.model.model_args.gdp_allow_neg_eigval is True
