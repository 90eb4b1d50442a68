"""Learning-rate schedules: linear warmup, then warmup-stable-decay (WSD) or a decay over the rest.

``[lr_scheduler] decay_ratio`` selects WSD: the LR holds at its peak until the last ``decay_ratio`` of
the steps, then decays (linear, sqrt or cosine) to ``min_lr_factor`` × peak. Without ``decay_ratio``
the decay starts right after warmup (``decay_type = "cosine"`` gives the usual cosine schedule).
Unlike a silent clamp, an inconsistent schedule is an error naming the key.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from torchtitan.components.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.config import LRScheduler as LRSchedulerConfig

DECAY_TYPES = ("linear", "sqrt", "cosine")


@dataclass(frozen=True)
class SchedulePhases:
    warmup_steps: int
    stable_steps: int
    decay_steps: int
    decay_type: str
    min_lr_factor: float


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
    if p.decay_type == "linear":
        shape = 1.0 - progress
    elif p.decay_type == "sqrt":
        shape = 1.0 - math.sqrt(progress)
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return p.min_lr_factor + (1.0 - p.min_lr_factor) * shape


def build_lr_schedulers(
    optimizers: OptimizersContainer, lr_scheduler_config: LRSchedulerConfig, training_steps: int
) -> LRSchedulersContainer:
    """TrainSpec ``build_lr_schedulers_fn``. A ``functools.partial`` (not a callable object) keeps the
    schedule out of the scheduler's state dict, so a resumed run uses the schedule of its config."""
    phases = schedule_phases(lr_scheduler_config, training_steps)
    return LRSchedulersContainer(optimizers, functools.partial(lr_factor, phases=phases))
