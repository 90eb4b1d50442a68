"""Learning-rate schedules: linear warmup, then warmup-stable-decay (WSD) or a decay over the rest.

``[lr_scheduler] decay_ratio`` selects WSD: the LR holds at its peak until the last ``decay_ratio`` of
the steps, then decays (linear, sqrt or cosine) to ``min_lr_factor`` × peak. Without ``decay_ratio``
the decay starts right after warmup (``decay_type = "cosine"`` gives the usual cosine schedule).
Unlike a silent clamp, an inconsistent schedule is an error naming the key.

The schedule is saved with the scheduler state. A run resumed under a different schedule (more
``[training] steps``, another decay) never warms up a second time and never jumps: from the resume step
the LR follows the new schedule only while neither schedule has started decaying; otherwise it decays
from its current value to the new schedule's minimum at the new last step, in the new decay shape.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.config import LRScheduler as LRSchedulerConfig
from torchtitan.tools.logging import logger

DECAY_TYPES = ("linear", "sqrt", "cosine")


@dataclass(frozen=True)
class SchedulePhases:
    warmup_steps: int
    stable_steps: int
    decay_steps: int
    decay_type: str
    min_lr_factor: float

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.stable_steps + self.decay_steps

    @property
    def decay_start(self) -> int:
        """First step index (0-based, as ``lr_factor`` counts) whose factor comes from the decay."""
        return self.warmup_steps + self.stable_steps

    def as_tensor(self) -> torch.Tensor:
        decay_type = DECAY_TYPES.index(self.decay_type)
        values = [self.warmup_steps, self.stable_steps, self.decay_steps, decay_type, self.min_lr_factor]
        return torch.tensor(values, dtype=torch.float64)

    @classmethod
    def from_tensor(cls, saved: torch.Tensor) -> SchedulePhases:
        warmup, stable, decay, decay_type, min_lr = torch.as_tensor(saved).tolist()
        return cls(int(warmup), int(stable), int(decay), DECAY_TYPES[int(decay_type)], float(min_lr))

    def describe(self) -> str:
        return (
            f"{self.total_steps} steps (warmup {self.warmup_steps}, stable {self.stable_steps}, "
            f"{self.decay_type} decay {self.decay_steps} to {self.min_lr_factor:g} x peak)"
        )


def schedule_phases(config: LRSchedulerConfig, training_steps: int) -> SchedulePhases:
    """Split the schedule's total steps into warmup / stable / decay, validating every key."""
    total = config.total_steps if config.total_steps is not None else training_steps
    if total <= 0:
        raise ValueError(f"[lr_scheduler] total_steps (or [training] steps) = {total}: expected > 0")
    warmup = int(config.warmup_steps)
    if not 0 <= warmup <= total:
        raise ValueError(f"[lr_scheduler] warmup_steps = {warmup}: expected 0 <= warmup_steps <= {total}")
    if config.decay_type not in DECAY_TYPES:
        raise ValueError(f"[lr_scheduler] decay_type = {config.decay_type!r}: expected one of {DECAY_TYPES}")
    if not 0.0 <= config.min_lr_factor <= 1.0:
        raise ValueError(f"[lr_scheduler] min_lr_factor = {config.min_lr_factor}: expected a value in [0, 1]")
    if config.decay_ratio is None:
        decay = total - warmup
    else:
        if not 0.0 <= config.decay_ratio <= 1.0:
            raise ValueError(f"[lr_scheduler] decay_ratio = {config.decay_ratio}: expected a value in [0, 1]")
        decay = round(total * config.decay_ratio)
        if warmup + decay > total:
            raise ValueError(
                f"[lr_scheduler] warmup_steps ({warmup}) + decay_ratio × total ({decay}) exceeds the "
                f"{total} total steps"
            )
    return SchedulePhases(warmup, total - warmup - decay, decay, config.decay_type, config.min_lr_factor)


def lr_factor(step: int, phases: SchedulePhases) -> float:
    """Multiplier of the peak LR used by optimizer step ``step + 1`` (LambdaLR counts from 0).

    Warmup reaches the peak exactly at its last step; the decay reaches ``min_lr_factor`` exactly at the
    last step of the schedule and stays there for any step beyond it.
    """
    p = phases
    if step < p.warmup_steps:
        return (step + 1) / p.warmup_steps
    if step < p.warmup_steps + p.stable_steps or p.decay_steps == 0:
        return 1.0
    progress = min(1.0, (step + 1 - p.warmup_steps - p.stable_steps) / p.decay_steps)
    return p.min_lr_factor + (1.0 - p.min_lr_factor) * _decay_shape(progress, p.decay_type)


def _decay_shape(progress: float, decay_type: str) -> float:
    """1 at progress 0, 0 at progress 1."""
    if decay_type == "linear":
        return 1.0 - progress
    if decay_type == "sqrt":
        return 1.0 - math.sqrt(progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def resumed_lr_factor(
    step: int, *, resume_step: int, saved: SchedulePhases, phases: SchedulePhases, skip_warmup: bool
) -> float:
    """The factor of a run that saved under ``saved`` and resumed at ``resume_step`` under ``phases``.

    While neither schedule decays, the new one applies (its warmup skipped once the saved warmup ended).
    Once either decays, the LR goes from the saved schedule's factor at ``resume_step`` (what the next
    step would have used, so no jump) to the new minimum at the new last step.
    """
    if step < resume_step:
        return lr_factor(step, saved)
    decaying = (resume_step >= saved.decay_start and saved.decay_steps > 0) or (
        resume_step >= phases.decay_start and phases.decay_steps > 0
    )
    if not decaying:
        if skip_warmup and step < phases.warmup_steps:
            return 1.0
        return lr_factor(step, phases)
    start = lr_factor(resume_step, saved)
    span = phases.total_steps - 1 - resume_step
    progress = 1.0 if span <= 0 else min(1.0, (step - resume_step) / span)
    return phases.min_lr_factor + (start - phases.min_lr_factor) * _decay_shape(progress, phases.decay_type)


class ResumableLRSchedulers(LRSchedulersContainer):
    """torchtitan's container plus the schedule in its state, so a resume under another schedule is
    detected, continued without a second warmup or a jump, and announced in one warning line."""

    def __init__(self, optimizers: OptimizersContainer, phases: SchedulePhases) -> None:
        super().__init__(optimizers, functools.partial(lr_factor, phases=phases))
        self.phases = phases
        # False while loading a checkpoint written before the schedule was saved (DCP asks for every key
        # that state_dict() names); set by the checkpoint manager, which can read the checkpoint's keys.
        self.checkpoint_has_schedule = True

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.checkpoint_has_schedule:
            state["schedule"] = self.phases.as_tensor()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = copy.copy(state_dict)
        saved_tensor = state.pop("schedule", None)
        self.checkpoint_has_schedule = True
        super().load_state_dict(state)
        resume_step = self.schedulers[0].last_epoch
        saved = None if saved_tensor is None else SchedulePhases.from_tensor(saved_tensor)
        if saved is not None and saved != self.phases:
            fn = functools.partial(
                resumed_lr_factor,
                resume_step=resume_step,
                saved=saved,
                phases=self.phases,
                skip_warmup=resume_step >= saved.warmup_steps,
            )
            for scheduler in self.schedulers:
                scheduler.lr_lambdas = [fn] * len(scheduler.optimizer.param_groups)
        # The next step's LR, whatever order the optimizer and the schedulers were loaded in.
        for scheduler in self.schedulers:
            for group, base_lr, fn in zip(
                scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
            ):
                group["lr"] = base_lr * fn(resume_step)
            scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
        if saved is not None and saved != self.phases:
            first = self.schedulers[0]
            base, fn = first.base_lrs[0], first.lr_lambdas[0]
            logger.warning(
                f"LR schedule changed at resume from step {resume_step}: saved {saved.describe()}, now "
                f"{self.phases.describe()}; no second warmup, the LR goes from {base * fn(resume_step):.3g} "
                f"at step {resume_step + 1} to {base * fn(self.phases.total_steps - 1):.3g} at step "
                f"{self.phases.total_steps}"
            )


def build_lr_schedulers(
    optimizers: OptimizersContainer, lr_scheduler_config: LRSchedulerConfig, training_steps: int
) -> ResumableLRSchedulers:
    """TrainSpec ``build_lr_schedulers_fn``. A ``functools.partial`` (not a callable object) keeps the
    function out of the scheduler's state dict; the schedule itself is saved as a tensor beside it."""
    return ResumableLRSchedulers(optimizers, schedule_phases(lr_scheduler_config, training_steps))
