"""NaN/Inf policy: skip an update whose gradient norm is not finite, up to a limit, then stop.

The decision uses the *global* gradient norm (already reduced over every data-parallel rank), so all
ranks skip or stop together without an extra collective. A NaN/Inf loss on any rank makes that rank's
gradients, and so the global norm, non-finite. A skipped step still consumes its batch and advances
the LR schedule: the run stays aligned with its step count and its data order.

Fused Adam/AdamW take the skip on the device (``arm_device_side_skip``), so the host need not read the norm
before it queues the update. It reads it one step late (``PendingGradNorm``: a pinned copy behind an event,
read after the next step's forward and backward are queued), and at once on logging steps, the last step
and checkpoints. The GPU never waits for the host between steps; a step over the limit stops the run before
the next update is queued.
"""

from __future__ import annotations

import math

import torch
from torchtitan.tools.logging import logger


def arm_device_side_skip(optimizers: list[torch.optim.Optimizer], grad_norm: torch.Tensor) -> bool:
    """True when every optimizer is a fused Adam/AdamW, having set each one's ``found_inf`` to 1.0 where
    ``grad_norm`` is not finite: their next ``step()`` then leaves parameters, moments and step counts as
    they are (the mechanism torch's GradScaler uses). False, and nothing set, otherwise."""
    adam = (torch.optim.Adam, torch.optim.AdamW)
    fused = all(isinstance(opt, adam) and all(g.get("fused") for g in opt.param_groups) for opt in optimizers)
    if not fused or not optimizers:
        return False
    found_inf = torch.isfinite(grad_norm.detach()).logical_not().to(torch.float32).reshape(())
    for opt in optimizers:
        opt.found_inf = found_inf
    return True


class NonFiniteTrainingError(RuntimeError):
    """Training stopped because too many steps had a NaN/Inf gradient norm."""


class NonFinitePolicy:
    """Counts skipped steps; ``should_skip`` returns True to skip or raises once over the limit."""

    def __init__(self, max_skipped_steps: int) -> None:
        if max_skipped_steps < 0:
            raise ValueError(f"[nan_policy] max_skipped_steps = {max_skipped_steps}: expected >= 0")
        self.max_skipped_steps = max_skipped_steps
        self.skipped_steps = 0
        self.last_skipped_step: int | None = None

    def should_skip(self, step: int, grad_norm: float, loss: float | None = None) -> bool:
        if math.isfinite(grad_norm):
            return False
        self.skipped_steps += 1
        self.last_skipped_step = step
        loss_text = "" if loss is None else f", local loss {loss}"
        if self.skipped_steps > self.max_skipped_steps:
            raise NonFiniteTrainingError(
                f"step {step}: gradient norm is {grad_norm}{loss_text}; {self.skipped_steps} steps with "
                f"NaN/Inf gradients so far exceed [nan_policy] max_skipped_steps = {self.max_skipped_steps}. "
                "Stopping: lower the learning rate, check the data, or resume from an earlier checkpoint."
            )
        logger.warning(
            f"step {step}: gradient norm is {grad_norm}{loss_text}; skipping this update "
            f"({self.skipped_steps}/{self.max_skipped_steps} allowed skips used)"
        )
        return True

    def state_dict(self) -> dict[str, int]:
        return {"skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped_steps = int(state.get("skipped_steps", 0))


class PendingGradNorm:
    """A step's global gradient norm (and loss) on their way to the host: the norm is copied into pinned
    memory behind a CUDA event, so reading it waits only for the kernels queued before it, not for the
    next step's."""

    def __init__(self, step: int, grad_norm: torch.Tensor, loss: torch.Tensor) -> None:
        self.step, self.loss = step, loss.detach()
        norm = grad_norm.detach().reshape(())
        self.event = None
        if norm.is_cuda:
            self.host = torch.empty((), dtype=norm.dtype, pin_memory=True)
            self.host.copy_(norm, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = norm.cpu()

    def value(self) -> float:
        if self.event is not None:
            self.event.synchronize()
        return float(self.host)
