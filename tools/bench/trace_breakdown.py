"""Where one training step's time goes, from the profiler traces the trainer writes.

    python tools/bench/trace_breakdown.py outputs/run/profile_traces/iteration_30/rank0_trace.json [...]

Train with ``--profiling.enable_profiling --profiling.profile_freq N`` (torchtitan's profiler: one active
step every N, traces under ``<dump>/profile_traces/iteration_N/rank<r>_trace.json``), then pass one or more
traces. Per trace, over the profiled step (the ``ProfilerStep#`` span on the host):

- step ms: the span's length; GPU busy: the union of all kernels, copies and sets on the GPU;
- compute: the union of non-collective kernels; collectives: the union of NCCL kernels; exposed
  collectives: the part of that union with no compute kernel running beside it (what overlap would save);
- GPU idle: step time the GPU does nothing (launch gaps, host-side waits, data loading);
- host syncs: calls that block the host on the GPU (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, synchronous ``cudaMemcpy``), how many and how long they blocked;
- the largest kernel groups by GPU time (GEMMs, NCCL, Triton kernels by name, elementwise ...).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intersection of two unions of disjoint sorted intervals."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def is_collective(name: str) -> bool:
    return name.startswith(("ncclDevKernel", "ncclKernel")) or "nccl" in name.lower()


def kernel_group(name: str) -> str:
    """A readable group for a kernel name: NCCL collectives by kind, GEMMs, Triton kernels by name, others."""
    if is_collective(name):
        kind = re.search(r"(AllGather|ReduceScatter|AllReduce|Broadcast|SendRecv)", name)
        return f"nccl {kind.group(1) if kind else 'other'}"
    lowered = name.lower()
    if any(t in lowered for t in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_")):
        return "gemm"
    if "flash" in lowered or "fmha" in lowered:
        return "attention (flash/SDPA)"
    if name.startswith("triton_"):
        return "inductor (fused elementwise/reductions)"
    if "elementwise" in lowered or "vectorized" in lowered or "reduce" in lowered:
        return "aten elementwise/reduce"
    return name[:60]


def breakdown(trace: dict) -> dict:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("no ProfilerStep# span in the trace (was it written by the trainer's profiler?)")
    step = max(steps, key=lambda e: e["ts"])
    lo, hi = step["ts"], step["ts"] + step["dur"]
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    spans = {"all": [], "compute": [], "collective": []}
    groups: dict[str, float] = defaultdict(float)
    for e in gpu:
        interval = (e["ts"], e["ts"] + e["dur"])
        if not clip([interval], lo, hi):
            continue
        spans["all"].append(interval)
        if e.get("cat") == "kernel":
            collective = is_collective(e["name"])
            spans["collective" if collective else "compute"].append(interval)
            groups[kernel_group(e["name"])] += e["dur"]
    busy, compute, comm = (union(clip(spans[k], lo, hi)) for k in ("all", "compute", "collective"))
    syncs = [e for e in events if e.get("cat") == "cuda_runtime" and e.get("name") in SYNC_CALLS
             and lo <= e["ts"] <= hi]  # fmt: skip
    return {
        "step_ms": (hi - lo) / 1e3,
        "gpu_busy_ms": length(busy) / 1e3,
        "compute_ms": length(compute) / 1e3,
        "collective_ms": length(comm) / 1e3,
        "exposed_collective_ms": (length(comm) - length(intersect(comm, compute))) / 1e3,
        "gpu_idle_ms": ((hi - lo) - length(busy)) / 1e3,
        "host_syncs": len(syncs),
        "host_sync_ms": sum(e["dur"] for e in syncs) / 1e3,
        "groups_ms": {k: v / 1e3 for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
    }


COLUMNS = ("step_ms", "gpu_busy_ms", "compute_ms", "collective_ms", "exposed_collective_ms", "gpu_idle_ms",
           "host_syncs", "host_sync_ms")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=8, help="kernel groups listed per trace")
    args = parser.parse_args(argv)
    rows = []
    for path in args.traces:
        try:
            rows.append((path, breakdown(json.loads(path.read_text()))))
        except (OSError, ValueError) as err:
            print(f"trace_breakdown.py: {path}: {err}", file=sys.stderr)
            return 2
    print("| trace | " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for path, r in rows:
        cells = [f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS]
        print(f"| {path} | " + " | ".join(cells) + " |")
    for path, r in rows:
        top = list(r["groups_ms"].items())[: args.top]
        print(f"\n{path}: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
