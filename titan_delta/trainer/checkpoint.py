"""Checkpoint folders that are never half-trusted: completion markers, latest-complete, keep-latest-k.

DCP writes ``.metadata`` last, but that alone does not prove a folder is whole: a save killed while
overwriting an older ``step-N`` keeps the old ``.metadata`` next to half-new shards, and a purge killed
mid-``rmtree`` leaves a folder with some shards gone. So rank 0 writes ``COMPLETE.json`` after DCP
reports the save finished (for async saves: when the upload future resolves), removes it before
(re)writing or deleting a folder, and only folders with the marker count as checkpoints — for loading,
for "latest", and for keep-latest-k (torn folders are deleted, never counted).

The marker also records the model (``model_name``, ``flavor`` and every resolved ModelArgs field as
``model_args``), which export and evaluation rebuild it from, and lists every file of the save with its
size. A folder whose files were later truncated or deleted (a full disk, a partial copy, a cleanup
script) no longer counts as complete either: resuming skips it for the previous whole checkpoint and the
warning names the file and what is wrong with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchtitan.components.checkpoint import LR_SCHEDULER, AsyncMode, CheckpointManager
from torchtitan.tools.logging import logger

from titan_delta.trainer.lr_schedule import ResumableLRSchedulers

COMPLETE_MARKER = "COMPLETE.json"
DCP_METADATA = ".metadata"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class CheckpointDir:
    step: int
    path: str
    complete: bool
    resumable: bool  # complete and holds optimizer/scheduler/data/train state, not just the model


def list_checkpoint_dirs(folder: str) -> list[CheckpointDir]:
    """All ``step-N`` folders under ``folder``, oldest first, with their completeness."""
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        match = _STEP_DIR.match(name)
        path = os.path.join(folder, name)
        if match and os.path.isdir(path):
            complete = is_complete(path)
            found.append(CheckpointDir(int(match.group(1)), path, complete, complete and _resumable(path)))
    return sorted(found, key=lambda c: c.step)


def _resumable(path: str) -> bool:
    try:
        with open(os.path.join(path, COMPLETE_MARKER)) as f:
            return bool(json.load(f).get("resumable", True))
    except (OSError, ValueError):
        return False


def saved_files(path: str) -> dict[str, int]:
    """{relative path: size in bytes} of every file of a save, the marker and temp files excluded."""
    files = {}
    for root, _, names in os.walk(path):
        for name in names:
            if name in (COMPLETE_MARKER, f".{COMPLETE_MARKER}.tmp"):
                continue
            full = os.path.join(root, name)
            files[os.path.relpath(full, path)] = os.path.getsize(full)
    return files


def checkpoint_problem(path: str) -> str | None:
    """Why ``path`` is not a whole checkpoint, or None when it is."""
    marker = os.path.join(path, COMPLETE_MARKER)
    if not os.path.isfile(marker):
        return f"no {COMPLETE_MARKER} (the save did not finish)"
    if not os.path.isfile(os.path.join(path, DCP_METADATA)):
        return f"{DCP_METADATA} is missing"
    try:
        with open(marker) as f:
            recorded = json.load(f).get("files")
    except (OSError, ValueError) as err:
        return f"{COMPLETE_MARKER} is unreadable ({err})"
    for name, size in sorted((recorded or {}).items()):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            return f"{name} is missing"
        actual = os.path.getsize(full)
        if actual != size:
            return f"{name} has {actual} bytes, {size} were written"
    return None


def is_complete(path: str) -> bool:
    return checkpoint_problem(path) is None


def latest_complete_step(folder: str, resumable_only: bool = False) -> int:
    """Step of the newest complete (and, if asked, resumable) checkpoint, or -1 when there is none."""
    steps = [c.step for c in list_checkpoint_dirs(folder) if (c.resumable if resumable_only else c.complete)]
    return max(steps) if steps else -1


def mark_complete(path: str, step: int, extra: dict[str, Any] | None = None) -> None:
    """Atomically write the completion marker (temp file + rename)."""
    payload = {"step": step, "finished_at_unix": time.time(), **(extra or {})}
    tmp = os.path.join(path, f".{COMPLETE_MARKER}.tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, COMPLETE_MARKER))


def unmark(path: str) -> None:
    """Make a folder incomplete before it is overwritten or deleted."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(path, COMPLETE_MARKER))


def stale_checkpoint_dirs(folder: str, keep_latest_k: int, protect_step: int | None = None) -> list[str]:
    """Folders to delete: all incomplete ones (except ``protect_step``, which may still be being
    written) and complete ones beyond the newest ``keep_latest_k``. k = 0 keeps every complete one."""
    dirs = list_checkpoint_dirs(folder)
    stale = [c.path for c in dirs if not c.complete and c.step != protect_step]
    complete = [c for c in dirs if c.complete]
    if keep_latest_k > 0:
        stale += [c.path for c in complete[:-keep_latest_k]]
    return stale


def delete_checkpoint_dir(path: str) -> None:
    unmark(path)
    shutil.rmtree(path, ignore_errors=True)


class MarkedCheckpointManager(CheckpointManager):
    """torchtitan's CheckpointManager with completion markers deciding what counts as a checkpoint."""

    def __init__(self, *args: Any, model_record: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Written into every marker, so export and eval rebuild exactly the trained model (field
        # overrides, CLI flags included) without the training command line.
        self._model_record = dict(model_record or {})
        self._pending_marks: list[tuple[Any, str, int, bool]] = []  # in-flight async saves
        self._mark_lock = threading.Lock()

    def _is_rank0(self) -> bool:
        return not dist.is_initialized() or dist.get_rank() == 0

    def _find_load_step(self, folder: str = "") -> int:
        folder = folder or self.folder
        dirs = list_checkpoint_dirs(folder)
        torn = [f"step-{c.step} ({checkpoint_problem(c.path)})" for c in dirs if not c.complete]
        if torn:
            logger.warning(f"Ignoring incomplete checkpoint folders in {folder}: {'; '.join(torn)}")
        model_only = [c.step for c in dirs if c.complete and not c.resumable]
        if model_only:
            logger.warning(f"Not resuming from model-only checkpoints in {folder}: steps {model_only}")
        return latest_complete_step(folder, resumable_only=True)

    def load(self, step: int = -1) -> bool:
        if step != -1 and self.enable and os.path.isdir(self.folder):
            path = self._create_checkpoint_id(step)
            problem = checkpoint_problem(path) if os.path.isdir(path) else None
            if problem:
                raise FileNotFoundError(
                    f"[checkpoint] load_step = {step}: {path} is incomplete: {problem}. Pick a complete step "
                    "or -1 for the latest complete one."
                )
        return super().load(step)

    def dcp_load(self, state_dict: dict[str, Any], checkpoint_id: str, from_hf: bool, *args, **kwargs):
        schedulers = state_dict.get(LR_SCHEDULER)
        if not from_hf and isinstance(schedulers, ResumableLRSchedulers):
            saved = dcp.FileSystemReader(checkpoint_id).read_metadata().state_dict_metadata
            schedulers.checkpoint_has_schedule = f"{LR_SCHEDULER}.schedule" in saved
        return super().dcp_load(state_dict, checkpoint_id, from_hf, *args, **kwargs)

    def dcp_save(
        self, state_dict: dict[str, Any], checkpoint_id: str, async_mode: AsyncMode, *args, **kwargs
    ):
        # Unmark before any rank writes: every rank enters DCP's planning collective only after rank 0
        # gets here, so no shard of the new save can land next to a stale marker.
        if self._is_rank0():
            os.makedirs(checkpoint_id, exist_ok=True)
            unmark(checkpoint_id)
        result = super().dcp_save(state_dict, checkpoint_id, async_mode, *args, **kwargs)
        step = int(os.path.basename(checkpoint_id).removeprefix("step-"))
        resumable = "train_state" in state_dict
        if async_mode == AsyncMode.DISABLED:
            # A synchronous DCP save returns on rank 0 only after its finish step gathered every rank's
            # write results and wrote .metadata: the folder is whole now.
            self._mark(checkpoint_id, step, resumable)
        else:
            upload = getattr(result, "upload_completion", result)
            self._pending_marks.append((upload, checkpoint_id, step, resumable))
            upload.add_done_callback(lambda fut: self._mark_if_ok(fut, checkpoint_id, step, resumable))
        return result

    def _async_wait(self) -> None:
        super()._async_wait()
        # Future.result() can return before done-callbacks ran: mark here too, so the purge that follows
        # a new save never mistakes the previous (finished) async checkpoint for a torn one.
        for future, path, step, resumable in self._pending_marks:
            if future.done():
                self._mark_if_ok(future, path, step, resumable)
        self._pending_marks = [p for p in self._pending_marks if not p[0].done()]

    def _mark_if_ok(self, future: Any, path: str, step: int, resumable: bool) -> None:
        if future.exception() is not None:
            logger.error(f"Async checkpoint save of step {step} failed; {path} stays incomplete")
            return
        # The async save resolves on the coordinator (rank 0) only after it gathered every rank's write
        # results and wrote .metadata, so rank 0's future resolving means the save is whole.
        self._mark(path, step, resumable)

    def _mark(self, path: str, step: int, resumable: bool) -> None:
        if not self._is_rank0():
            return
        with self._mark_lock:  # the async done-callback and _async_wait may both get here
            if os.path.isfile(os.path.join(path, COMPLETE_MARKER)):
                return
            world = dist.get_world_size() if dist.is_initialized() else 1
            extra = {"world_size": world, "resumable": resumable, "files": saved_files(path)}
            extra.update(self._model_record)
            mark_complete(path, step, extra)
        logger.info(f"Checkpoint step {step} complete ({path})")

    def save(self, curr_step: int, last_step: bool = False) -> None:
        super().save(curr_step, last_step)
        if last_step and self._should_save(curr_step, last_step):
            self._purge_stale_checkpoints()  # torchtitan skips keep-latest-k after the final save

    def _purge_stale_checkpoints(self) -> None:
        if not (self.keep_latest_k > 0 and self._is_rank0() and os.path.isdir(self.folder)):
            return
        newest = max((c.step for c in list_checkpoint_dirs(self.folder)), default=None)
        for path in stale_checkpoint_dirs(self.folder, self.keep_latest_k, protect_step=newest):
            unmark(path)  # synchronously: a purge killed half-way never leaves a "complete" folder
            assert self.purge_thread is not None
            self.purge_queue.put(path)
