"""Trainer entry point with injected faults, for the fault-injection tests: ``python -m tests.trainer.faults
[train args]``, under torchrun like ``titan_delta.train``.

``TITAN_DELTA_FAULT`` (JSON) picks one fault; it fires on rank ``rank`` (every rank if absent) at ``step``:
- ``{"kind": "nan_loss", "rank": 1, "step": 3}``: that rank's loss (and so its gradients) become NaN.
- ``{"kind": "kill_rank", "rank": 1, "step": 4}``: that rank SIGKILLs itself mid-step, after taking its
  batch and before the forward's first collective.
- ``{"kind": "hold_save", "step": 4}``: every rank announces ``FAULT: holding the save of step-4`` while
  the checkpoint writer is inside that save and holds it there, so the test can kill the job mid-save.
``TITAN_DELTA_ROWS_DIR`` records every batch a rank takes from the loader, one line per step in
``rank<R>.txt`` (a hash per row), so a test can check which tokens a run consumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter

from titan_delta.data.loader import TitanDataLoader
from titan_delta.train import main
from titan_delta.trainer.trainer import TitanDeltaTrainer

HOLD_SECONDS = 120  # far longer than the test waits: the job is killed while held


def row_hashes(inputs: torch.Tensor, labels: torch.Tensor) -> list[str]:
    """One short hash per row of (input tokens, label tokens)."""
    rows = torch.cat([inputs, labels], dim=1).to(torch.int64).numpy()
    return [hashlib.sha1(row.tobytes()).hexdigest()[:16] for row in rows]


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _fires(fault: dict, step: int) -> bool:
    return step == fault["step"] and fault.get("rank", _rank()) == _rank()


def _install_fault(fault: dict) -> None:
    kind = fault["kind"]
    if kind in ("nan_loss", "kill_rank"):
        original_step = TitanDeltaTrainer.forward_backward_step

        def forward_backward_step(self, **kwargs):
            if not _fires(fault, self.step):
                return original_step(self, **kwargs)
            if kind == "kill_rank":
                print(f"FAULT: rank {_rank()} kills itself at step {self.step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            loss_fn = self.loss_fn
            self.loss_fn = lambda *args, **kw: loss_fn(*args, **kw) * float("nan")
            try:
                return original_step(self, **kwargs)
            finally:
                self.loss_fn = loss_fn

        TitanDeltaTrainer.forward_backward_step = forward_backward_step
    elif kind == "hold_save":
        original_write = FileSystemWriter.write_data

        def write_data(self, plan, planner):
            if os.path.basename(str(self.path)) == f"step-{fault['step']}":
                print(f"FAULT: holding the save of step-{fault['step']}", flush=True)
                time.sleep(HOLD_SECONDS)
            return original_write(self, plan, planner)

        FileSystemWriter.write_data = write_data
    else:
        raise ValueError(f"TITAN_DELTA_FAULT: unknown kind {kind!r}")


def _record_rows(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank{_rank()}.txt")
    original_iter = TitanDataLoader.__iter__

    def recording_iter(self):
        for batch, labels in original_iter(self):
            with open(path, "a") as f:
                f.write(" ".join(row_hashes(batch["input"], labels)) + "\n")
            yield batch, labels

    TitanDataLoader.__iter__ = recording_iter


if __name__ == "__main__":
    if os.environ.get("TITAN_DELTA_FAULT"):
        _install_fault(json.loads(os.environ["TITAN_DELTA_FAULT"]))
    if os.environ.get("TITAN_DELTA_ROWS_DIR"):
        _record_rows(os.environ["TITAN_DELTA_ROWS_DIR"])
    sys.exit(main(sys.argv[1:]))
