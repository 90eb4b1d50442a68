"""``tools/bench/kernel_resources.py``: offline sm_90 compiles of the real launches, on the CPU machine.

The tool runs in its own process (it replaces Triton's active driver and must not run under the
interpreter). Checked: every kernel of a DeltaFormer forward and of a GDP forward+backward is compiled and
reported with its registers and blocks per SM, and the launch options the code sets (the preparation
launch's register cap at D = 64, dqkw's at K = 64) reach the compile.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "kernel_resources.py"


def _report(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=600,
                         env=env, cwd=TOOL.parents[1])  # fmt: skip
    if run.returncode and "ptxas" in run.stderr:
        pytest.skip(f"this Triton build cannot run ptxas here: {run.stderr.strip().splitlines()[-1][:200]}")
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def _kernels(report: str) -> dict[str, tuple[int, int, str]]:
    """kernel name -> (registers, blocks per SM, its constexpr line), first configuration of each."""
    lines = report.splitlines()
    found = {}
    for line, flags in zip(lines, [*lines[1:], ""], strict=True):
        m = re.match(r"(\w+)\s+regs\s+(\d+) .* blocks/SM (\d+)", line)
        if m and m.group(1) not in found:
            found[m.group(1)] = (int(m.group(2)), int(m.group(3)), flags)
    return found


def test_deltaformer_forward_report():
    kernels = _kernels(_report("deltaformer", "--shape", "1x128x2x64", "--forward-only"))
    assert set(kernels) == {"_prep_kernel", "_superblock_wave_kernel"}
    regs, blocks, flags = kernels["_prep_kernel"]
    assert "maxnreg=128" in flags and regs <= 128 and blocks >= 1


def test_gdp_forward_backward_report():
    kernels = _kernels(_report("gdp", "--shape", "1x64x2x64", "--nh", "2"))
    assert {"wy_series_kernel", "state_fwd_lean_kernel", "output_fwd_t_kernel", "state_bwd_lean_kernel",
            "dqkw_sliced_kernel", "wy_bwd_hoisted_kernel"} <= set(kernels)  # fmt: skip
    regs, _, flags = kernels["dqkw_sliced_kernel"]
    assert "maxnreg=168" in flags and regs <= 168
    assert all(0 < r <= 255 and b >= 1 for r, b, _ in kernels.values())


def test_bad_shape_is_refused():
    run = subprocess.run([sys.executable, str(TOOL), "gdp", "--shape", "8x2048"], capture_output=True,
                         text=True, timeout=120, cwd=TOOL.parents[1])  # fmt: skip
    assert run.returncode != 0 and "BxTxHxD" in run.stderr
