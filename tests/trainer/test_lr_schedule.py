"""Warmup-stable-decay and cosine schedules: exact values at the phase boundaries, shapes, bad configs."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from torchtitan.config import LRScheduler as LRSchedulerConfig

from titan_delta.trainer.lr_schedule import build_lr_schedulers, lr_factor, schedule_phases
from titan_delta.trainer.optimizer import GroupedOptimizersContainer, WeightDecayRule


def _factors(config: LRSchedulerConfig, steps: int) -> list[float]:
    phases = schedule_phases(config, steps)
    return [lr_factor(i, phases) for i in range(steps)]


def test_wsd_warmup_stable_then_linear_decay_to_min() -> None:
    total, warmup = random.randint(20, 200), random.randint(1, 10)
    config = LRSchedulerConfig(warmup_steps=warmup, decay_ratio=0.25, decay_type="linear", min_lr_factor=0.1)
    f = _factors(config, total)
    decay = round(total * 0.25)
    assert f[:warmup] == pytest.approx([(i + 1) / warmup for i in range(warmup)])
    assert f[warmup - 1] == 1.0
    assert all(v == 1.0 for v in f[warmup : total - decay])
    assert f[-1] == pytest.approx(0.1)
    tail = f[total - decay :]
    assert all(a > b for a, b in itertools.pairwise(tail))
    steps = [b - a for a, b in itertools.pairwise(tail)]
    assert max(steps) == pytest.approx(min(steps))  # linear


def test_cosine_decays_from_end_of_warmup() -> None:
    total, warmup = random.randint(30, 300), random.randint(1, 20)
    config = LRSchedulerConfig(warmup_steps=warmup, decay_type="cosine", min_lr_factor=0.0)
    f = _factors(config, total)
    decay = total - warmup
    for i in random.sample(range(warmup, total), 10):
        progress = (i + 1 - warmup) / decay
        assert f[i] == pytest.approx(0.5 * (1 + math.cos(math.pi * progress)))
    assert f[-1] == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(total + 5, schedule_phases(config, total)) == pytest.approx(0.0, abs=1e-12)


def test_scheduler_drives_the_optimizer_lr() -> None:
    model = torch.nn.Linear(4, 4)
    optimizers = GroupedOptimizersContainer(
        [model], torch.optim.AdamW, {"lr": 2e-3, "weight_decay": 0.1}, WeightDecayRule()
    )
    config = LRSchedulerConfig(warmup_steps=2, decay_ratio=0.5, decay_type="linear", min_lr_factor=0.0)
    schedulers = build_lr_schedulers(optimizers, config, 6)
    seen = []
    for _ in range(6):
        seen.append(optimizers.optimizers[0].param_groups[0]["lr"])
        optimizers.step()
        schedulers.step()
    assert seen == pytest.approx([1e-3, 2e-3, 2e-3, 2e-3 * 2 / 3, 2e-3 / 3, 0.0], abs=1e-12)
    assert "lr_lambdas" in schedulers.state_dict()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"warmup_steps": 11}, "warmup_steps = 11"),
        ({"warmup_steps": 5, "decay_ratio": 0.8}, "exceeds the 10 total steps"),
        ({"warmup_steps": 0, "decay_ratio": 1.5}, "decay_ratio = 1.5"),
        ({"warmup_steps": 0, "decay_type": "exp"}, "decay_type = 'exp'"),
        ({"warmup_steps": 0, "min_lr_factor": -0.1}, "min_lr_factor = -0.1"),
        ({"total_steps": 0}, "total_steps"),
    ],
)
def test_bad_schedules_name_the_key(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=r"\[lr_scheduler\]") as err:
        schedule_phases(LRSchedulerConfig(**fields), 10)
    assert message in str(err.value)


def _run_schedule(config: LRSchedulerConfig, steps: int, start_state: dict | None = None, until: int = 0):
    """The LRs a fresh optimizer sees over steps [resumed step, until), and the schedulers."""
    model = torch.nn.Linear(4, 4)
    optimizers = GroupedOptimizersContainer(
        [model], torch.optim.AdamW, {"lr": 2e-3, "weight_decay": 0.1}, WeightDecayRule()
    )
    schedulers = build_lr_schedulers(optimizers, config, steps)
    if start_state is not None:
        schedulers.load_state_dict(start_state)
    seen = []
    while schedulers.schedulers[0].last_epoch < until:
        seen.append(optimizers.optimizers[0].param_groups[0]["lr"])
        optimizers.step()
        schedulers.step()
    return seen, schedulers


WSD = LRSchedulerConfig(warmup_steps=2, decay_ratio=0.2, decay_type="linear", min_lr_factor=0.1)


def test_resume_with_more_steps_after_the_decay_stays_at_the_minimum(caplog) -> None:
    # the finding: a 10-step run decayed to 2e-4; resuming it with 20 steps jumped back to the 2e-3 peak
    first, schedulers = _run_schedule(WSD, 10, until=10)
    assert first[-1] == pytest.approx(2e-4)
    with caplog.at_level("WARNING"):
        resumed, _ = _run_schedule(WSD, 20, schedulers.state_dict(), until=20)
    assert resumed == pytest.approx([2e-4] * 10)
    (line,) = [r.message for r in caplog.records if "LR schedule changed" in r.message]
    assert "from step 10" in line and "saved 10 steps" in line and "now 20 steps" in line


def test_resume_with_more_steps_mid_decay_continues_the_decay_without_a_jump() -> None:
    uninterrupted, _ = _run_schedule(WSD, 20, until=20)
    _, schedulers = _run_schedule(WSD, 20, until=18)  # decay began after step 16
    resumed, _ = _run_schedule(WSD, 40, schedulers.state_dict(), until=40)
    assert resumed[0] == pytest.approx(uninterrupted[18])  # the LR the saved run would have used next
    assert all(a > b for a, b in itertools.pairwise(resumed))
    assert resumed[-1] == pytest.approx(2e-4)


def test_resume_with_more_steps_before_the_decay_follows_the_new_schedule() -> None:
    _, schedulers = _run_schedule(WSD, 20, until=8)
    resumed, _ = _run_schedule(WSD, 40, schedulers.state_dict(), until=40)
    fresh, _ = _run_schedule(WSD, 40, until=40)
    assert resumed == pytest.approx(fresh[8:])  # stable until the new decay, which ends at the new end


def test_resume_with_a_longer_warmup_does_not_warm_up_again() -> None:
    _, schedulers = _run_schedule(WSD, 20, until=5)
    longer = LRSchedulerConfig(warmup_steps=10, decay_ratio=0.2, decay_type="linear", min_lr_factor=0.1)
    resumed, _ = _run_schedule(longer, 20, schedulers.state_dict(), until=20)
    assert resumed[:11] == pytest.approx([2e-3] * 11)


def test_resume_with_the_same_schedule_is_unchanged(caplog) -> None:
    uninterrupted, _ = _run_schedule(WSD, 20, until=20)
    _, schedulers = _run_schedule(WSD, 20, until=12)
    with caplog.at_level("WARNING"):
        resumed, _ = _run_schedule(WSD, 20, schedulers.state_dict(), until=20)
    assert resumed == uninterrupted[12:]
    assert not [r for r in caplog.records if "LR schedule changed" in r.message]


def test_a_checkpoint_saved_without_its_schedule_still_loads(tmp_path) -> None:
    """Checkpoints written before the schedule was saved lack lr_scheduler.schedule; DCP would refuse the
    missing key, so the checkpoint manager tells the schedulers not to ask for it."""
    import torch.distributed.checkpoint as dcp

    from titan_delta.trainer.checkpoint import MarkedCheckpointManager

    uninterrupted, _ = _run_schedule(WSD, 20, until=20)
    _, schedulers = _run_schedule(WSD, 20, until=12)
    old = schedulers.state_dict()
    del old["schedule"]
    dcp.save({"lr_scheduler": old}, checkpoint_id=str(tmp_path), no_dist=True)

    _, resumed_schedulers = _run_schedule(WSD, 20, until=0)
    manager = object.__new__(MarkedCheckpointManager)  # dcp_load needs no more of the manager than this
    manager.states, manager.sd_adapter = {}, None
    manager.dcp_load({"lr_scheduler": resumed_schedulers}, str(tmp_path), False, False)
    scheduler = resumed_schedulers.schedulers[0]
    assert scheduler.last_epoch == 12 and resumed_schedulers.checkpoint_has_schedule
    assert scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(uninterrupted[12])
