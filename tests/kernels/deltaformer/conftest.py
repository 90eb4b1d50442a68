"""Every kernel-allocated buffer is NaN-poisoned in these tests, so an element a kernel forgets to write
fails the comparison with the reference."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _poison_kernel_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITAN_DELTA_POISON", "1")
