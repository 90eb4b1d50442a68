"""Which step-N folders count as checkpoints: completion markers, latest-complete, keep-latest-k."""

from __future__ import annotations

import json
import random
from pathlib import Path

from titan_delta.trainer.checkpoint import (
    COMPLETE_MARKER,
    checkpoint_problem,
    delete_checkpoint_dir,
    latest_complete_step,
    list_checkpoint_dirs,
    mark_complete,
    saved_files,
    stale_checkpoint_dirs,
    unmark,
)


def _make(
    folder: Path, step: int, metadata: bool = True, marker: bool = True, resumable: bool = True
) -> Path:
    path = folder / f"step-{step}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"shard")
    if metadata:
        (path / ".metadata").write_bytes(b"meta")
    if marker:
        mark_complete(str(path), step, {"resumable": resumable, "files": saved_files(str(path))})
    return path


def test_latest_skips_torn_and_model_only(tmp_path: Path) -> None:
    steps = sorted(random.sample(range(1, 1000), 4))
    for s in steps[:2]:
        _make(tmp_path, s)
    _make(tmp_path, steps[2], resumable=False)  # a model-only final save
    _make(tmp_path, steps[3], marker=False)  # killed mid-write: .metadata of an older save, no marker
    _make(tmp_path, steps[3] + 1, metadata=False, marker=False)  # killed before .metadata
    (tmp_path / "not-a-step").mkdir()
    assert latest_complete_step(str(tmp_path), resumable_only=True) == steps[1]
    assert latest_complete_step(str(tmp_path)) == steps[2]
    assert [c.step for c in list_checkpoint_dirs(str(tmp_path))] == [*steps, steps[3] + 1]
    assert latest_complete_step(str(tmp_path / "missing")) == -1


def test_marker_needs_dcp_metadata_too(tmp_path: Path) -> None:
    path = _make(tmp_path, 3, metadata=False, marker=True)
    assert latest_complete_step(str(tmp_path)) == -1
    (path / ".metadata").write_bytes(b"meta")
    assert latest_complete_step(str(tmp_path)) == 3
    assert json.loads((path / COMPLETE_MARKER).read_text())["step"] == 3
    unmark(str(path))
    assert latest_complete_step(str(tmp_path)) == -1


def test_keep_latest_k_counts_complete_only(tmp_path: Path) -> None:
    for s in (2, 4, 6, 8):
        _make(tmp_path, s)
    torn_old = _make(tmp_path, 5, marker=False)
    in_flight = _make(tmp_path, 10, marker=False)
    stale = stale_checkpoint_dirs(str(tmp_path), keep_latest_k=2, protect_step=10)
    assert sorted(stale) == sorted([str(tmp_path / "step-2"), str(tmp_path / "step-4"), str(torn_old)])
    assert str(in_flight) not in stale
    assert stale_checkpoint_dirs(str(tmp_path), keep_latest_k=0, protect_step=10) == [str(torn_old)]
    for path in stale:
        delete_checkpoint_dir(path)
    assert [(c.step, c.complete) for c in list_checkpoint_dirs(str(tmp_path))] == [
        (6, True),
        (8, True),
        (10, False),
    ]


def test_truncated_or_deleted_files_make_a_checkpoint_incomplete(tmp_path: Path) -> None:
    for s in (2, 4, 6):
        _make(tmp_path, s)
    assert json.loads((tmp_path / "step-6" / COMPLETE_MARKER).read_text())["files"] == {
        "__0_0.distcp": 5,
        ".metadata": 4,
    }
    (tmp_path / "step-6" / "__0_0.distcp").write_bytes(b"sh")  # truncated
    assert checkpoint_problem(str(tmp_path / "step-6")) == "__0_0.distcp has 2 bytes, 5 were written"
    assert latest_complete_step(str(tmp_path), resumable_only=True) == 4
    (tmp_path / "step-4" / "__0_0.distcp").unlink()
    assert checkpoint_problem(str(tmp_path / "step-4")) == "__0_0.distcp is missing"
    assert latest_complete_step(str(tmp_path), resumable_only=True) == 2
    assert "did not finish" in checkpoint_problem(str(_make(tmp_path, 8, marker=False)))
    # keep-latest-k never counts a damaged folder among the k it keeps
    stale = stale_checkpoint_dirs(str(tmp_path), keep_latest_k=2, protect_step=8)
    assert sorted(stale) == [str(tmp_path / "step-4"), str(tmp_path / "step-6")]
