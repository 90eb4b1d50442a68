"""Hugging Face interop tests run offline, with transformers' caches (remote-code modules, hub) in a
temporary HF_HOME, and skip where transformers is not installed (it is not a titan-delta dependency)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

for _name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="titan_delta_hf_home_"))
os.environ.setdefault("HF_MODULES_CACHE", os.path.join(os.environ["HF_HOME"], "modules"))

pytest.importorskip("transformers", reason="transformers is needed only for Hugging Face interop")

FAMILIES = ("deltaformer", "gated_deltaproduct", "deltaformer_swa", "gated_deltaproduct_swa", "transformer")
VOCAB = 16384  # the shipped tokenizer's size, so exports come with a tokenizer that fits


def _small_model(family: str, **overrides):
    from titan_delta.models import build_model

    torch.manual_seed(0)
    return build_model(family, "debug", vocab_size=VOCAB, window_size=4, **overrides).eval()


@pytest.fixture(scope="session")
def small_model():
    """family, **overrides → the debug flavor at the tokenizer's vocabulary, with a 4-token SWA window so
    short sequences already slide it (deterministic weights)."""
    return _small_model


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, Path]]:
    """family → (our model, its export folder), written once per session."""
    from titan_delta.hf.export_folder import export_model

    root = tmp_path_factory.mktemp("exports")
    made = {}
    for family in FAMILIES:
        model = _small_model(family)
        export_model(model, str(root / family), model_name=family, flavor="debug", step=3)
        made[family] = (model, root / family)
    return made
