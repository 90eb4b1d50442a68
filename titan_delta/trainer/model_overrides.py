"""``[model]`` keys that replace single ModelArgs fields of the chosen flavor.

Every ModelArgs field except ``vocab_size`` (the tokenizer's) and ``max_seq_len`` (``[training] seq_len``)
is a ``[model]`` key and a ``--model.<field>`` flag under its ModelArgs name; None (the default) keeps the
flavor's value. The trainer, the config check and the checkpoint readers all resolve a run's ModelArgs
here, so they agree on the model that was trained.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from titan_delta.models import ModelArgs
from titan_delta.models.flavors import get_model_args
from titan_delta.trainer.config import MODEL_OVERRIDE_FIELDS
from titan_delta.trainer.config_error import ConfigError


def model_overrides(section: Mapping[str, Any] | Any) -> dict[str, Any]:
    """The ModelArgs fields a ``[model]`` section sets (a parsed config's section or a TOML table)."""
    get = section.get if isinstance(section, Mapping) else lambda key: getattr(section, key, None)
    return {key: get(key) for key in MODEL_OVERRIDE_FIELDS if get(key) is not None}


def resolve_model_args(family: str, flavor: str, overrides: Mapping[str, Any]) -> ModelArgs:
    """The flavor's ModelArgs with ``overrides`` applied and validated; an invalid value or combination is
    a one-line ConfigError naming the ``[model]`` key(s) responsible."""
    try:
        return get_model_args(family, flavor, **overrides)
    except (ValueError, TypeError, AssertionError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        # ModelArgs names the offending field in its message: blame the override it names, else all of them
        named = [key for key in overrides if re.search(rf"\b{re.escape(key)}\b", message)]
        blamed = ", ".join(f"{key} = {overrides[key]!r}" for key in named[:1] or overrides)
        raise ConfigError(f"[model] {blamed}: {message} (on top of {family} flavor {flavor!r})") from err


def resolve_job_model_args(job_config: Any) -> ModelArgs:
    """The ModelArgs a parsed JobConfig trains: ``[model] name``/``flavor`` plus its field overrides."""
    model = job_config.model
    return resolve_model_args(model.name, model.flavor, model_overrides(model))
