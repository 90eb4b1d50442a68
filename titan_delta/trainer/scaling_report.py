"""Scaling runs' metric lines → tokens/s per GPU, MFU and peak memory, and the efficiency table against 1 GPU
(used by tools/bench/scaling.py)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

METRICS = re.compile(
    r"step:\s*(\d+)\s+loss:\s*([\d.naif]+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+).*?mfu:\s*([\d.na]+)%"
)


@dataclass
class Result:
    model: str
    strategy: str
    gpus: int
    tps: float | None  # tokens/s per GPU, None when the run failed
    mfu: float | None
    memory_gib: float | None
    log: Path


def summarize(
    log: Path, warmup_logs: int, skip: tuple[int, int] | None = None
) -> tuple[float, float, float] | None:
    """(mean tokens/s per GPU, mean MFU %, peak memory GiB) of the metric lines after warm-up, less the lines
    logged at steps ``skip[0] < step <= skip[1]`` (the intervals a profiler slowed)."""
    rows = [m.groups() for m in METRICS.finditer(log.read_text(errors="replace"))]
    kept = [r for r in rows[warmup_logs:] if skip is None or not skip[0] < int(r[0]) <= skip[1]]
    if not kept:
        return None
    tps = statistics.mean(float(r[3].replace(",", "")) for r in kept)
    mfu = statistics.mean(float(r[4]) for r in kept)
    return tps, mfu, max(float(r[2]) for r in rows)


HEADER = ("| model | strategy | GPUs | tokens/s per GPU | efficiency | MFU % | peak memory GiB |\n"
          "|---|---|---|---|---|---|---|")  # fmt: skip


def row(r: Result, results: list[Result]) -> str:
    if r.tps is None:
        return f"| {r.model} | {r.strategy} | {r.gpus} | FAILED ({r.log}) | | | |"
    one = next((b.tps for b in results if b.gpus == 1 and b.model == r.model), None)
    eff = f"{100 * r.tps / one:.1f} %" if one else "-"
    measured = f"{r.tps:,.0f} | {eff} | {r.mfu:.1f} | {r.memory_gib:.1f}"
    return f"| {r.model} | {r.strategy} | {r.gpus} | {measured} |"


def table(results: list[Result]) -> str:
    return "\n".join([HEADER, *(row(r, results) for r in results)])
