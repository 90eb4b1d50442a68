"""AdamW with two parameter groups: weights that decay and parameters that must not.

Gates and decay rates (A_log, dt_bias), norm scales and biases are excluded from weight decay: pulling
them toward zero changes what the layer computes (e.g. A_log → 0 fixes the decay rate) instead of
regularising it. The container keeps torchtitan's OptimizersContainer contract (one optimizer per
model part, flattened FQN-keyed state dicts), so DCP resharding and the LR-scheduler container work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.config import Optimizer as OptimizerConfig
from torchtitan.distributed import ParallelDims

from titan_delta.trainer.config import DEFAULT_NO_WEIGHT_DECAY

OPTIMIZER_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "AdamW": torch.optim.AdamW,
    "Adam": torch.optim.Adam,
}
IMPLEMENTATIONS = ("fused", "foreach", "for-loop")

# Wrappers (activation checkpointing, torch.compile) insert these into FQNs; they are not part of names.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_fqn(name: str) -> str:
    """The parameter name as the unwrapped model spells it."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


@dataclass(frozen=True)
class WeightDecayRule:
    """Decides, per parameter, whether weight decay applies."""

    no_decay_substrings: tuple[str, ...] = tuple(DEFAULT_NO_WEIGHT_DECAY)
    decay_1d_params: bool = False

    def decays(self, name: str, param: torch.Tensor) -> bool:
        if param.ndim < 2 and not self.decay_1d_params:
            return False
        fqn = clean_fqn(name)
        return not any(s in fqn for s in self.no_decay_substrings)


def split_param_groups(
    model: nn.Module, rule: WeightDecayRule, weight_decay: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """Param groups [decay, no-decay] of the trainable parameters, and the names without decay.

    Empty groups are dropped (an optimizer group with no parameters breaks DCP's flattened state dict).
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    no_decay_names: list[str] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if rule.decays(name, param):
            decay.append(param)
        else:
            no_decay.append(param)
            no_decay_names.append(clean_fqn(name))
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]], no_decay_names


class GroupedOptimizersContainer(OptimizersContainer):
    """OptimizersContainer whose per-part optimizers get decay / no-decay parameter groups."""

    def __init__(
        self,
        model_parts: list[nn.Module],
        optimizer_cls: type[torch.optim.Optimizer],
        optimizer_kwargs: dict[str, Any],
        rule: WeightDecayRule,
    ) -> None:
        self.optimizers = []
        self.model_parts = model_parts
        self.no_decay_names: list[str] = []
        all_params: list[nn.Parameter] = []
        weight_decay = optimizer_kwargs["weight_decay"]
        for model in model_parts:
            groups, names = split_param_groups(model, rule, weight_decay)
            self.no_decay_names.extend(names)
            self.optimizers.append(optimizer_cls(groups, **optimizer_kwargs))
            all_params.extend(p for g in groups for p in g["params"])
        self._validate_length(len(model_parts))
        self._post_init(all_params, optimizer_kwargs)


def optimizer_kwargs_from_config(config: OptimizerConfig) -> dict[str, Any]:
    """Validated keyword arguments for the torch optimizer; errors name the [optimizer] key."""
    if config.name not in OPTIMIZER_CLASSES:
        raise ValueError(f"[optimizer] name = {config.name!r}: expected one of {sorted(OPTIMIZER_CLASSES)}")
    if config.implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"[optimizer] implementation = {config.implementation!r}: expected one of {IMPLEMENTATIONS}"
        )
    if not config.lr > 0:
        raise ValueError(f"[optimizer] lr = {config.lr}: expected a positive learning rate")
    if config.weight_decay < 0:
        raise ValueError(f"[optimizer] weight_decay = {config.weight_decay}: expected >= 0")
    for key in ("beta1", "beta2"):
        value = getattr(config, key)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"[optimizer] {key} = {value}: expected a value in [0, 1)")
    if not config.eps > 0:
        raise ValueError(f"[optimizer] eps = {config.eps}: expected > 0")
    return {
        "lr": config.lr,
        "betas": (config.beta1, config.beta2),
        "eps": config.eps,
        "weight_decay": config.weight_decay,
        "fused": config.implementation == "fused",
        "foreach": config.implementation == "foreach",
    }


def build_optimizers(
    model_parts: list[nn.Module],
    optimizer_config: OptimizerConfig,
    parallel_dims: ParallelDims,
    ft_manager: object | None = None,
) -> GroupedOptimizersContainer:
    """TrainSpec ``build_optimizers_fn``: AdamW (or Adam) with the weight-decay exclusions applied."""
    del parallel_dims, ft_manager  # same optimizer for every parallelism; TorchFT is not supported
    if optimizer_config.early_step_in_backward:
        raise ValueError("[optimizer] early_step_in_backward = true is not supported by titan-delta")
    kwargs = optimizer_kwargs_from_config(optimizer_config)
    rule = WeightDecayRule(
        no_decay_substrings=tuple(getattr(optimizer_config, "no_weight_decay", DEFAULT_NO_WEIGHT_DECAY)),
        decay_1d_params=bool(getattr(optimizer_config, "decay_1d_params", False)),
    )
    return GroupedOptimizersContainer(model_parts, OPTIMIZER_CLASSES[optimizer_config.name], kwargs, rule)
