"""The GDP and short-conv tools, each run as its own process on the CPU machine.

``tools/bench/kernel_resources.py`` compiles the real launches offline for sm_90 (it replaces Triton's active
driver and must not run under the interpreter): every kernel of a forward+backward is reported with its
registers and blocks per SM, and the launch table's register cap reaches the compile; likewise the short
conv's three kernels with their own tilings.
``tools/bench/gated_delta_product.py`` refuses to run without a GPU (exit 2, a clear message).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
BENCH = REPO / "tools" / "bench"


def _run(tool: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(BENCH / tool), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)  # fmt: skip


def _kernels(report: str) -> dict[str, tuple[int, int, str]]:
    """kernel name -> (registers, blocks per SM, its constexpr line), first configuration of each."""
    lines = report.splitlines()
    found = {}
    for line, flags in zip(lines, [*lines[1:], ""], strict=True):
        m = re.match(r"(\w+)\s+regs\s+(\d+) .* blocks/SM (\d+)", line)
        if m and m.group(1) not in found:
            found[m.group(1)] = (int(m.group(2)), int(m.group(3)), flags)
    return found


def test_kernel_resources_gdp_forward_backward():
    run = _run("kernel_resources.py", "gdp", "--shape", "1x64x2x64", "--nh", "2")
    if run.returncode and "ptxas" in run.stderr:
        pytest.skip(f"this Triton build cannot run ptxas here: {run.stderr.strip().splitlines()[-1][:200]}")
    assert run.returncode == 0, run.stderr[-2000:]
    kernels = _kernels(run.stdout)
    assert set(kernels) == {"wy_series_kernel", "state_fwd_lean_kernel", "output_fwd_t_kernel",
                            "dv_local_kernel", "state_bwd_lean_kernel", "dqkw_sliced_kernel",
                            "wy_bwd_hoisted_kernel"}  # fmt: skip
    regs, _, flags = kernels["dqkw_sliced_kernel"]
    assert "maxnreg=168" in flags and regs <= 168
    assert all(0 < r <= 255 and b >= 1 for r, b, _ in kernels.values())


def test_kernel_resources_short_conv_forward_backward():
    run = _run("kernel_resources.py", "short_conv", "--shape", "1x64x2x64")
    if run.returncode and "ptxas" in run.stderr:
        pytest.skip(f"this Triton build cannot run ptxas here: {run.stderr.strip().splitlines()[-1][:200]}")
    assert run.returncode == 0, run.stderr[-2000:]
    kernels = _kernels(run.stdout)
    assert set(kernels) == {"short_conv_fwd_kernel", "short_conv_bwd_kernel"}
    _, _, flags = kernels["short_conv_bwd_kernel"]
    assert "ROWS=128" in flags and "BLOCK_C=128" in flags and "num_warps=1" in flags  # its own geometry
    assert all(0 < r <= 255 and b >= 1 for r, b, _ in kernels.values())


def test_kernel_resources_refuses_a_bad_shape():
    run = _run("kernel_resources.py", "gdp", "--shape", "8x2048", timeout=120)
    assert run.returncode != 0 and "BxTxHxD" in run.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_benchmark_refuses_without_a_gpu():
    run = _run("gated_delta_product.py", "--profile", "1x16x1x16x2", timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "needs a CUDA GPU" in run.stderr


def test_launch_sweep_checks_each_variant_against_the_shipped_row():
    """Under the interpreter: a consistent variant matches the shipped row; overriding grad_block_v below V
    while the hoisted wy_bwd (which takes all of V in one tile) stays selected is flagged WRONG; a field the
    launch table does not have is one clear error (exit 2)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    tool = [sys.executable, str(BENCH / "gdp_launch_sweep.py"), "--shape", "1x20x1x32x64x2"]
    run = subprocess.run([*tool, "--variants", "output_block_v=32; grad_block_v=32"], capture_output=True,
                         text=True, timeout=300, env=env, cwd=REPO)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in run.stdout.splitlines() if line.startswith("| ")}
    assert "WRONG" not in rows["output_block_v=32"] and "WRONG" in rows["grad_block_v=32"], run.stdout
    assert sum(line.startswith("| shipped |") for line in run.stdout.splitlines()) == 2
    bad = subprocess.run([*tool, "--variants", "tile=64"], capture_output=True, text=True, env=env, cwd=REPO)
    assert bad.returncode == 2 and "unknown launch field 'tile'" in bad.stderr
