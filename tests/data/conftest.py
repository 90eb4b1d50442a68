"""Fixtures of the data tests: the shipped tokenizer, loaded once per session."""

from __future__ import annotations

import warnings

import pytest

from titan_delta.data import load_tokenizer

# torchdata calls a deprecated torch API on every loader start; it is noise here.
warnings.filterwarnings("ignore", message=".*set_vital.*")


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer("default", threads=2)
