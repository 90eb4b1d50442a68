"""NaN/Inf policy: skip up to the limit, then stop with an error naming the step; counts survive resume."""

from __future__ import annotations

import math
import random

import pytest
import torch

from titan_delta.trainer.nonfinite import NonFinitePolicy, NonFiniteTrainingError, arm_device_side_skip


def test_skips_up_to_the_limit_then_stops_naming_the_step() -> None:
    limit = random.randint(0, 4)
    policy = NonFinitePolicy(limit)
    assert not policy.should_skip(1, 1.25)
    step = 1
    for _ in range(limit):
        assert policy.should_skip(step + 1, random.choice([math.nan, math.inf]))
        assert not policy.should_skip(step + 2, 0.5)
        step += 2
    with pytest.raises(NonFiniteTrainingError, match=rf"^step {step + 1}: gradient norm is nan") as err:
        policy.should_skip(step + 1, math.nan, loss=float("inf"))
    assert f"max_skipped_steps = {limit}" in str(err.value)
    assert policy.skipped_steps == limit + 1


def test_state_round_trip_and_validation() -> None:
    policy = NonFinitePolicy(3)
    policy.should_skip(7, -math.inf)
    restored = NonFinitePolicy(3)
    restored.load_state_dict(policy.state_dict())
    assert restored.skipped_steps == 1
    with pytest.raises(ValueError, match=r"\[nan_policy\] max_skipped_steps = -1"):
        NonFinitePolicy(-1)


def _adamw(fused: bool) -> tuple[torch.nn.Parameter, torch.optim.AdamW]:
    param = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 6))
    return param, torch.optim.AdamW([param], lr=0.1, weight_decay=0.1, fused=fused)


def _state(param, opt) -> list[torch.Tensor]:
    state = opt.state[param]
    return [t.detach().clone() for t in (param, state["exp_avg"], state["exp_avg_sq"], state["step"])]


def test_fused_adamw_skips_a_non_finite_step_on_the_device() -> None:
    """Armed with a NaN/Inf norm, the fused step changes nothing (parameters, moments, step count); armed
    with a finite norm it is exactly the unarmed optimizer's step."""
    param, opt = _adamw(fused=True)
    twin, plain = _adamw(fused=True)
    for p in (param, twin):
        p.grad = torch.arange(6.0) - 2.0
    assert arm_device_side_skip([opt], param.grad.norm())
    opt.step()
    plain.step()
    before = _state(param, opt)
    for value in (math.nan, math.inf):
        param.grad = torch.full((6,), value)
        assert arm_device_side_skip([opt], param.grad.norm())
        opt.step()
        for got, want in zip(_state(param, opt), before, strict=True):
            assert torch.equal(got, want)
    for p in (param, twin):
        p.grad = torch.linspace(0.5, -0.5, 6)
    assert arm_device_side_skip([opt], param.grad.norm())
    opt.step()
    plain.step()
    for got, want in zip(_state(param, opt), _state(twin, plain), strict=True):
        assert torch.equal(got, want)


def test_only_fused_adam_is_armed() -> None:
    _, opt = _adamw(fused=False)
    assert not arm_device_side_skip([opt], torch.tensor(math.nan))
    assert not hasattr(opt, "found_inf")
    _, fused = _adamw(fused=True)
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    assert not arm_device_side_skip([fused, sgd], torch.tensor(1.0))
    assert not arm_device_side_skip([], torch.tensor(1.0))
