"""One torchtitan TrainSpec per model family, registered under the family's name.

``[model] name`` is the family (``deltaformer``, ``gated_deltaproduct``, ``deltaformer_swa``,
``gated_deltaproduct_swa``, ``transformer``) and ``[model] flavor`` its size (``debug``, ``340M``,
``1.3B``). Every spec shares the model class, parallelize_fn, data, loss, optimizer, LR schedule and
metrics and validator builders; only the flavor table differs.
"""

from __future__ import annotations

import copy

from torchtitan.components.loss import build_cross_entropy_loss
from torchtitan.protocols.train_spec import TrainSpec, register_train_spec

from titan_delta.data import build_dataloader, build_tokenizer
from titan_delta.models import MODEL_FLAVORS, TitanDeltaLM
from titan_delta.trainer.lr_schedule import build_lr_schedulers
from titan_delta.trainer.metrics import build_metrics_processor
from titan_delta.trainer.optimizer import build_optimizers
from titan_delta.trainer.parallelize import parallelize_titan_delta
from titan_delta.trainer.validation import build_validator

_registered: dict[str, TrainSpec] = {}


def make_train_spec(family: str) -> TrainSpec:
    """A TrainSpec for ``family`` with private copies of its flavors (torchtitan mutates them in place)."""
    if family not in MODEL_FLAVORS:
        raise ValueError(f"unknown model family {family!r}; expected one of {sorted(MODEL_FLAVORS)}")
    return TrainSpec(
        model_cls=TitanDeltaLM,
        model_args={flavor: copy.deepcopy(args) for flavor, args in MODEL_FLAVORS[family].items()},
        parallelize_fn=parallelize_titan_delta,
        pipelining_fn=None,
        build_optimizers_fn=build_optimizers,
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=build_dataloader,
        build_tokenizer_fn=build_tokenizer,
        build_loss_fn=build_cross_entropy_loss,
        build_validator_fn=build_validator,
        build_metrics_processor_fn=build_metrics_processor,
    )


def register_train_specs() -> dict[str, TrainSpec]:
    """Register every family once per process (idempotent); returns {name: spec}."""
    for family in MODEL_FLAVORS:
        if family not in _registered:
            spec = make_train_spec(family)
            register_train_spec(family, spec)
            _registered[family] = spec
    return dict(_registered)


def registered_families() -> dict[str, tuple[str, ...]]:
    """{model name: its flavors} for config checks."""
    return {name: tuple(spec.model_args) for name, spec in register_train_specs().items()}
