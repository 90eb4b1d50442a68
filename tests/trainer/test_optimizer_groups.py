"""Weight decay applies to matrices only: A_log, dt_bias, norms and biases of every family are excluded."""

from __future__ import annotations

import pytest
import torch
from torchtitan.config import Optimizer as OptimizerConfig

from titan_delta.models import FAMILIES, build_model
from titan_delta.trainer.optimizer import WeightDecayRule, build_optimizers, clean_fqn


def _names(container, decay: bool) -> set[str]:
    names = {id(p): n for n, p in container.model_parts[0].named_parameters()}
    wanted = [g for g in container.optimizers[0].param_groups if (g["weight_decay"] > 0) == decay]
    return {names[id(p)] for g in wanted for p in g["params"]}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_param_groups_per_family(family: str) -> None:
    model = build_model(family, "debug")
    config = OptimizerConfig(lr=1e-3, weight_decay=0.1, implementation="for-loop")
    container = build_optimizers([model], config, parallel_dims=None)
    decayed, excluded = _names(container, True), _names(container, False)
    assert decayed and excluded and not decayed & excluded
    assert decayed | excluded == {n for n, _ in model.named_parameters()}
    for name in excluded:
        param = model.get_parameter(name)
        assert param.ndim < 2 or any(s in name for s in ("A_log", "dt_bias", "bias", "norm")), name
    for name in decayed:
        assert model.get_parameter(name).ndim >= 2 and "norm" not in name, name
    if family.startswith("gated_deltaproduct"):
        assert any("A_log" in n for n in excluded) and any("dt_bias" in n for n in excluded)


def test_decay_only_shrinks_decayed_params() -> None:
    """With zero gradients AdamW's update is the decoupled decay alone: w <- w (1 - lr wd) or unchanged."""
    model = build_model("gated_deltaproduct", "debug")
    lr, wd = 0.5, 0.1
    container = build_optimizers(
        [model], OptimizerConfig(lr=lr, weight_decay=wd, implementation="foreach"), None
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    container.step()
    decayed = _names(container, True)
    for name, param in model.named_parameters():
        expected = before[name] * (1 - lr * wd) if name in decayed else before[name]
        torch.testing.assert_close(param.detach(), expected, rtol=1e-6, atol=0)


def test_rule_sees_through_wrapper_prefixes() -> None:
    rule = WeightDecayRule()
    w = torch.empty(4, 4)
    assert (
        clean_fqn("layers.0._checkpoint_wrapped_module._orig_mod.mixer.wq.weight")
        == "layers.0.mixer.wq.weight"
    )
    assert rule.decays("layers.0._orig_mod.mixer.wq.weight", w)
    assert not rule.decays("layers.0._orig_mod.mixer_norm.weight", w)
    assert not rule.decays("layers.0.mixer.A_log", torch.empty(4))
    assert WeightDecayRule(decay_1d_params=True, no_decay_substrings=()).decays("x.A_log", torch.empty(4))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "SGD"}, "[optimizer] name = 'SGD'"),
        ({"lr": 0.0}, "[optimizer] lr = 0.0"),
        ({"weight_decay": -1.0}, "[optimizer] weight_decay = -1.0"),
        ({"beta2": 1.0}, "[optimizer] beta2 = 1.0"),
        ({"implementation": "cuda"}, "[optimizer] implementation = 'cuda'"),
    ],
)
def test_bad_optimizer_settings(fields: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        build_optimizers([torch.nn.Linear(2, 2)], OptimizerConfig(**fields), None)
    assert message in str(err.value)
