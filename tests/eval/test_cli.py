"""``python -m titan_delta.eval`` on exported and DCP checkpoints, with offline local tasks."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from titan_delta.eval.checkpoint import load_checkpoint
from titan_delta.eval.cli import main
from titan_delta.models.flavors import build_model
from titan_delta.trainer.checkpoint import mark_complete

TASKS = "titan_delta_tiny_mc,titan_delta_tiny_cloze"


def _small_model():
    return build_model("gated_deltaproduct_swa", "debug", vocab_size=16384, dim=32, max_seq_len=64)


def _export(model, folder) -> None:
    """The layout tools/export_checkpoint.py writes."""
    os.makedirs(folder)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "model.safetensors")
    )
    args = {k: v for k, v in dataclasses.asdict(model.model_args).items() if not k.startswith("_")}
    config = {
        "model_name": "gated_deltaproduct_swa",
        "flavor": "debug",
        "model_args": args,
        "tokenizer": "default",
        "step": 7,
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)


def test_exported_checkpoint_end_to_end(tmp_path, capsys) -> None:
    model = _small_model()
    _export(model, tmp_path / "export")
    out = tmp_path / "results" / "out.json"
    code = main(["--checkpoint", str(tmp_path / "export"), "--tasks", TASKS, "--limit", "3",
                 "--batch-size", "4", "--output", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "titan_delta_tiny_mc" in printed and "acc" in printed and "perplexity" in printed
    results = json.loads(out.read_text())
    assert 0.0 <= results["results"]["titan_delta_tiny_mc"]["acc,none"] <= 1.0
    assert results["titan_delta"]["step"] == 7


def test_dcp_checkpoint_loads_the_trained_weights(tmp_path, capsys) -> None:
    model = build_model("deltaformer", "debug", vocab_size=16384, dim=32)
    step_dir = tmp_path / "dump" / "checkpoint" / "step-3"
    dcp.save(model.state_dict(), checkpoint_id=str(step_dir))
    mark_complete(str(step_dir), 3)
    config = tmp_path / "train.toml"
    config.write_text('[model]\nname = "deltaformer"\nflavor = "debug"\n[training]\nseq_len = 64\n')
    with pytest.raises(ValueError, match="pass --config"):
        load_checkpoint(str(tmp_path / "dump"))
    # the flavor's dim is 64, the checkpoint's 32: a wrong config is refused, never silently half-loaded
    with pytest.raises(ValueError, match="weight shapes differ"):
        load_checkpoint(str(tmp_path / "dump"), str(config))

    model = build_model("deltaformer", "debug", vocab_size=16384)
    step_dir = tmp_path / "dump2" / "checkpoint" / "step-5"
    dcp.save(model.state_dict(), checkpoint_id=str(step_dir))
    mark_complete(str(step_dir), 5)
    loaded = load_checkpoint(str(tmp_path / "dump2"), str(config))
    assert loaded.step == 5 and loaded.model.model_args.max_seq_len == 64
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name
    out = tmp_path / "dcp.json"
    code = main(["--checkpoint", str(step_dir), "--config", str(config), "--tasks", "titan_delta_tiny_ppl",
                 "--limit", "2", "--output", str(out)])  # fmt: skip
    assert (
        code == 0 and "bits_per_byte,none" in json.loads(out.read_text())["results"]["titan_delta_tiny_ppl"]
    )


def test_bad_input_gives_clear_errors(tmp_path, capsys) -> None:
    assert main(["--checkpoint", str(tmp_path / "missing"), "--tasks", TASKS]) == 2
    assert "not a folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["--checkpoint", str(tmp_path / "empty"), "--tasks", TASKS]) == 2
    assert "--config" in capsys.readouterr().err
    _export(_small_model(), tmp_path / "export")
    assert main(["--checkpoint", str(tmp_path / "export"), "--tasks", TASKS, "--limit", "-1"]) == 2
    assert "--limit" in capsys.readouterr().err
    code = main(["--checkpoint", str(tmp_path / "export"), "--tasks", "no_such_task_xyz",
                 "--output", str(tmp_path / "x.json")])  # fmt: skip
    assert code == 2 and "--tasks: 'no_such_task_xyz': unknown task" in capsys.readouterr().err
