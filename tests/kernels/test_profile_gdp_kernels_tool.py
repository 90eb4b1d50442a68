"""``tools/bench/profile_gdp_kernels.py`` on the CPU machine: it imports and refuses to run without a GPU
(exit 2, a clear message), and its table sums every kernel but lists only those of 2 µs or more per step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_refuses_without_a_gpu():
    run = subprocess.run([sys.executable, str(TOOLS / "profile_gdp_kernels.py"), "--specs", "1x16x1x16x2"],
                         capture_output=True, text=True, timeout=300, cwd=TOOLS.parent)  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    assert "needs a CUDA GPU" in run.stderr


def test_report_table(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(TOOLS))
    import profile_gdp_kernels as tool

    name = "a_kernel_with_a_name_longer_than_sixty_characters_" + "x" * 20
    tool.report("ours `default`", [(name, 0.5, 1.0), ("small_kernel", 0.25, 3.0), ("tiny", 0.001, 2.0)])
    out = capsys.readouterr().out
    assert "ours `default`: 0.751 ms of kernel time per fwd+bwd step" in out
    assert "| `small_kernel` | 0.250 | 3 |" in out
    assert "tiny" not in out
    assert f"| `{name[:59]}…` | 0.500 | 1 |" in out
