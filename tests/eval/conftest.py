"""Eval tests run offline: HF offline variables and a temporary HF_HOME / datasets cache for every test."""

from __future__ import annotations

import os
import tempfile

import pytest

for _name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="titan_delta_eval_hf_"))

pytest.importorskip("lm_eval", reason="lm-eval is the optional 'eval' extra")


@pytest.fixture(autouse=True)
def _offline_hf(tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """datasets reads its cache path and offline flag at import: patch them too, in case another test
    module imported datasets before this conftest set the variables."""
    import datasets.config

    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


@pytest.fixture(autouse=True)
def _local_task_index_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Indexing lm-eval's ~15k built-in tasks takes 20+ s on two cores and nothing here is built in; an
    unknown name still fails to load exactly as it would with the full index."""
    from lm_eval.tasks import TaskManager

    import titan_delta.eval.harness as harness

    monkeypatch.setattr(harness, "task_manager_for", lambda names: TaskManager(include_defaults=False))


@pytest.fixture(scope="session")
def tokenizer():
    from titan_delta.data.tokenizer import load_tokenizer

    return load_tokenizer()
