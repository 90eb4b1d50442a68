"""Test set-up: Triton runs in its interpreter when there is no GPU; ``gpu`` tests skip without CUDA."""

from __future__ import annotations

import os
import zlib

import torch

if not torch.cuda.is_available():
    # Must be set before triton is first imported: the @triton.jit kernels then run on the CPU.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

SHARED_RUN_FIXTURES = {"runs_root", "seed_checkpoint", "fsdp_run", "single_run"}

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under pytest-xdist (--dist loadgroup) the tests that share the once-per-run training runs
    # (tests/trainer/conftest.py) stay on one worker, which runs each of them once.
    shared_runs = pytest.mark.xdist_group("shared_training_runs")
    for item in items:
        if SHARED_RUN_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(shared_runs)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run tools/bench/proof_kernels.sh on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# Fresh random inputs on every run; set TITAN_DELTA_TEST_SEED to replay a failing run.
RUN_SEED = int(os.environ.get("TITAN_DELTA_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def pytest_report_header(config: pytest.Config) -> str:
    return f"titan-delta test seed: TITAN_DELTA_TEST_SEED={RUN_SEED}"


@pytest.fixture(autouse=True)
def _seed_per_test(request: pytest.FixtureRequest) -> None:
    """Each test draws from its own stream of the run's seed, so one test's draws never shift another's."""
    torch.manual_seed((RUN_SEED + zlib.crc32(request.node.nodeid.encode())) % (2**31))
