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

With ``--components FFN_HIDDEN,VOCAB`` (the model's SwiGLU width and vocabulary, e.g. ``2816,16384`` at
340M) it also splits the step's kernel time by model component: the mixer op (this project's Triton kernels
other than the short convolution's, flash/cuDNN/flex attention), GEMMs by their operand sizes (read from the
launching ``aten::mm`` and the like, so the trace needs ``record_shapes``, which the trainer's profiler
sets: a size equal to VOCAB is the LM head, one equal to FFN_HIDDEN the MLP, the rest the mixer's
projections), convolutions (the short-conv op's kernels, cuDNN's, and inductor kernels fused around them),
the loss, the optimizer, and the remaining fused elementwise/reduction kernels (norms, gates, activations,
RoPE). GEMM time is per kernel, so sizes must not collide (the flavors' widths do not).

With ``--idle N`` it also says why the GPU idled: a gap before a kernel (or copy) whose launch call began
after the GPU had run dry is time the GPU waited on the host; the rest of the idle time (launched before the
gap opened) is device-side latency. Host-bound gaps that follow the end of a host sync are the sync's cost;
the others are attributed to the innermost host op around the late launch on its thread (a custom op's
Python, a compiled graph's wrapper, the optimizer ...), and the N largest are listed. The profiler slows the
host (it records every op), so a profiled step overstates host-bound idle; compare models within one run.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LAUNCH_ARG = "correlation"  # links a runtime call (launch, copy, set) on the host to its GPU event
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


def is_project_kernel(name: str) -> bool:
    """This project's Triton kernels (``kernels/``): plain function names ending in ``_kernel``."""
    return not name.startswith("triton_") and re.fullmatch(r"_?[a-z0-9_]+_kernel", name) is not None


COMPONENTS = ("mixer op", "mixer projections", "MLP", "LM head", "conv", "loss", "optimizer",
              "elementwise/norms/gates", "other")  # fmt: skip


def component(name: str, dims: list[int], ffn_hidden: int, vocab: int) -> str:
    """The model component a kernel belongs to, from its name and its launching op's operand sizes."""
    lowered = name.lower()
    attention = ("flash", "fmha", "flex_attention", "sdpa", "cudnn::fusion")  # cuDNN SDPA and its helpers
    if is_project_kernel(name) and "conv" in lowered:  # kernels/short_conv: glue around the mixer op
        return "conv"
    if is_project_kernel(name) or any(t in lowered for t in attention):
        return "mixer op"
    if any(t in lowered for t in ("adam", "multi_tensor_apply", "foreach")):
        return "optimizer"
    if any(t in lowered for t in ("conv", "fprop", "dgrad", "wgrad")):  # cuDNN's are implicit GEMMs
        return "conv"
    if any(t in lowered for t in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_")):
        if vocab in dims:
            return "LM head"
        return "MLP" if ffn_hidden in dims else "mixer projections"
    if any(t in lowered for t in ("nll_loss", "log_softmax", "cross_entropy", "logsumexp")):
        return "loss"
    if name.startswith("triton_") or any(t in lowered for t in ("elementwise", "vectorized", "reduce")):
        return "elementwise/norms/gates"
    return "other"


def _operand_sizes(events: list[dict]) -> dict[int, list[int]]:
    """External id of each host op -> every size in its input shapes (``record_shapes``)."""
    sizes: dict[int, list[int]] = {}
    for e in events:
        if e.get("cat") != "cpu_op":
            continue
        args = e.get("args", {})
        ext, shapes = args.get("External id"), args.get("Input Dims")
        if ext is None or not shapes:
            continue
        flat = [d for shape in shapes if isinstance(shape, list) for d in shape if isinstance(d, int)]
        sizes.setdefault(ext, []).extend(flat)
    return sizes


def _host_ops(events: list[dict]) -> dict[int, tuple[list[float], list[tuple[float, str]]]]:
    """Host thread id -> (start times, [(end, name)]) of its host ops, sorted by start."""
    ops: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("cpu_op", "user_annotation", "python_function") and "tid" in e:
            ops[e["tid"]].append((e["ts"], e["ts"] + e["dur"], str(e.get("name", ""))))
    return {tid: ([a for a, _, _ in sorted(s)], [(b, n) for _, b, n in sorted(s)]) for tid, s in ops.items()}


def _enclosing(ops: tuple[list[float], list[tuple[float, str]]] | None, ts: float) -> str:
    """The innermost (latest-starting) host op around ``ts``; "(no host op)" if none is."""
    starts, rest = ops or ([], [])
    for end, name in reversed(rest[: bisect.bisect_right(starts, ts)]):
        if end >= ts and not name.startswith("ProfilerStep#"):
            return name
    return "(no host op)"


def idle_causes(events: list[dict], gpu: list[dict], syncs: list[dict], lo: float, hi: float) -> dict:
    """The step's GPU idle time split into host-bound gaps (after a sync, or by the host op around the late
    launch) and device-side gaps (module docstring); the step's tail after its last GPU event is host time."""
    launches = {e["args"][LAUNCH_ARG]: e for e in events
                if e.get("cat") == "cuda_runtime" and LAUNCH_ARG in e.get("args", {})}  # fmt: skip
    sync_ends = sorted(e["ts"] + e["dur"] for e in syncs)
    ops = _host_ops(events)
    by_op: dict[str, float] = defaultdict(float)
    host_us = after_sync_us = device_us = 0.0
    gaps = 0
    frontier = lo  # the end of the GPU's work so far
    for e in sorted(gpu, key=lambda e: e["ts"]):
        if frontier < e["ts"] < hi:
            gap = e["ts"] - frontier
            launch = launches.get(e.get("args", {}).get(LAUNCH_ARG))
            if launch is None or launch["ts"] < frontier:
                device_us += gap
            else:
                gaps += 1
                host_us += gap
                i = bisect.bisect_left(sync_ends, frontier)
                if i < len(sync_ends) and sync_ends[i] <= launch["ts"]:
                    after_sync_us += gap
                else:
                    by_op[_enclosing(ops.get(launch.get("tid")), launch["ts"])] += gap
        frontier = max(frontier, e["ts"] + e["dur"])
    if frontier < hi:
        host_us += hi - frontier
        by_op["(step end: the host after the last GPU work)"] += hi - frontier
    return {
        "host_bound_ms": host_us / 1e3,
        "host_bound_gaps": gaps,
        "after_sync_ms": after_sync_us / 1e3,
        "device_side_ms": device_us / 1e3,
        "by_op_ms": sorted(((n, us / 1e3) for n, us in by_op.items()), key=lambda r: -r[1]),
    }


def breakdown(trace: dict, components: tuple[int, int] | None = None) -> dict:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("no ProfilerStep# span in the trace (was it written by the trainer's profiler?)")
    step = max(steps, key=lambda e: e["ts"])
    lo, hi = step["ts"], step["ts"] + step["dur"]
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    spans = {"all": [], "compute": [], "collective": []}
    groups: dict[str, float] = defaultdict(float)
    parts: dict[str, float] = defaultdict(float)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # name -> [launches, total us]
    sizes = _operand_sizes(events) if components else {}
    in_step = []
    for e in gpu:
        interval = (e["ts"], e["ts"] + e["dur"])
        if not clip([interval], lo, hi):
            continue
        in_step.append(e)
        spans["all"].append(interval)
        if e.get("cat") == "kernel":
            collective = is_collective(e["name"])
            spans["collective" if collective else "compute"].append(interval)
            groups[kernel_group(e["name"])] += e["dur"]
            kernels[e["name"]][0] += 1
            kernels[e["name"]][1] += e["dur"]
            if components and not collective:
                dims = sizes.get(e.get("args", {}).get("External id"), [])
                parts[component(e["name"], dims, *components)] += e["dur"]
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
        "components_ms": {k: parts[k] / 1e3 for k in COMPONENTS if k in parts},
        "kernels": sorted(((n, c, us / 1e3) for n, (c, us) in kernels.items()), key=lambda r: -r[2]),
        "idle": idle_causes(events, in_step, syncs, lo, hi),
    }


COLUMNS = ("step_ms", "gpu_busy_ms", "compute_ms", "collective_ms", "exposed_collective_ms", "gpu_idle_ms",
           "host_syncs", "host_sync_ms")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=8, help="kernel groups listed per trace")
    parser.add_argument("--kernels", type=int, default=0, metavar="N",
                        help="also list the N kernels with the most GPU time per trace (launches, ms)")
    parser.add_argument("--idle", type=int, default=0, metavar="N",
                        help="also split GPU idle into host-bound and device-side gaps, N host ops listed")
    parser.add_argument("--components", default="", metavar="FFN_HIDDEN,VOCAB",
                        help="also split kernel time by model component (module docstring)")
    args = parser.parse_args(argv)
    components = None
    if args.components:
        try:
            ffn_hidden, vocab = (int(x) for x in args.components.split(","))
        except ValueError:
            print(f"trace_breakdown.py: --components: expected FFN_HIDDEN,VOCAB such as 2816,16384, got "
                  f"{args.components!r}", file=sys.stderr)
            return 2
        components = (ffn_hidden, vocab)
    rows = []
    for path in args.traces:
        try:
            rows.append((path, breakdown(json.loads(path.read_text()), components)))
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
    for path, r in rows if args.kernels else ():
        print(f"\n{path}: the {args.kernels} kernels with the most GPU time")
        for name, count, ms in r["kernels"][: args.kernels]:
            print(f"  {ms:8.2f} ms {count:5d}x  {name[:150]}")
    for path, r in rows if args.idle else ():
        idle = r["idle"]
        print(f"\n{path}: GPU idle {r['gpu_idle_ms']:.1f} ms = waiting on the host "
              f"{idle['host_bound_ms']:.1f} ms ({idle['host_bound_gaps']} gaps; "
              f"{idle['after_sync_ms']:.1f} ms after host syncs) + device-side "
              f"{idle['device_side_ms']:.1f} ms; host-bound idle by the host op around the late launch:")
        for name, ms in idle["by_op_ms"][: args.idle]:
            print(f"  {ms:8.2f} ms  {name[:150]}")
    if components:
        print("\n| trace | " + " | ".join(COMPONENTS) + " | GPU idle |")
        print("|---" * (len(COMPONENTS) + 2) + "|")
        for path, r in rows:
            total = sum(r["components_ms"].values()) + r["gpu_idle_ms"]
            cells = [r["components_ms"].get(k, 0.0) for k in COMPONENTS] + [r["gpu_idle_ms"]]
            shares = " | ".join(f"{ms:.1f} ms ({100 * ms / total:.0f} %)" for ms in cells)
            print(f"| {path} | {shares} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
