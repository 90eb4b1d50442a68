"""The exporter refuses incomplete checkpoints and bad arguments with messages naming them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import DEBUG_CONFIG
from titan_delta.hf.export_cli import ExportError, export, main, resolve_step_dir
from titan_delta.trainer.checkpoint import mark_complete


def _step(folder: Path, step: int, complete: bool) -> Path:
    path = folder / f"step-{step}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"")
    if complete:
        mark_complete(str(path), step)
    return path


def test_picks_latest_complete_and_refuses_torn(tmp_path: Path) -> None:
    _step(tmp_path, 3, complete=True)
    torn = _step(tmp_path, 7, complete=False)
    assert resolve_step_dir(str(tmp_path), None) == str(tmp_path / "step-3")
    with pytest.raises(ExportError, match="incomplete checkpoint"):
        resolve_step_dir(str(torn), None)
    with pytest.raises(ExportError, match="incomplete checkpoint"):
        resolve_step_dir(str(tmp_path), 7)
    with pytest.raises(ExportError, match="not a folder"):
        resolve_step_dir(str(tmp_path / "nope"), None)


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _step(tmp_path, 1, complete=True)
    with pytest.raises(ExportError, match="--dtype int8"):
        export(str(tmp_path), str(DEBUG_CONFIG), str(tmp_path / "out"), dtype="int8")
    args = [
        "--checkpoint",
        str(tmp_path),
        "--config",
        str(tmp_path / "missing.toml"),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(args) == 2
    assert "--config" in capsys.readouterr().err
