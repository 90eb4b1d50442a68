"""NaN/Inf policy: skip up to the limit, then stop with an error naming the step; counts survive resume."""

from __future__ import annotations

import math
import random

import pytest

from titan_delta.trainer.nonfinite import NonFinitePolicy, NonFiniteTrainingError


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
