"""Data-parallel scaling table: tokens/s per GPU, efficiency against 1 GPU, MFU and peak memory per model,
GPU count and strategy, every run on this machine in one invocation.

    python tools/bench/scaling.py --models transformer deltaformer gated_deltaproduct --gpus 1 2 4 \\
        --strategies fsdp ddp hsdp --steps 100 --out outputs/scaling

Each model trains its ``train_configs/<model>_<size>.toml`` config (``--config`` changes the pattern; a
model may name its own size, ``deltaformer@1.3B``) through ``launch/run_single_node.sh`` on the first N GPUs
(``CUDA_VISIBLE_DEVICES``), on the embedded corpus, at the config's local batch unless ``--local-batch``.
The 1-GPU baselines of several models run side by side, one per GPU; multi-GPU runs go one at a time.
Throughput is the mean over the log lines after the first ``--warmup-logs`` (compilation). Strategies:
``config`` (what the shipped config chooses), ``fsdp`` (full shard over all GPUs), ``fsdp_keep`` (FSDP
without resharding after forward), ``ddp`` (replicate only), ``hsdp`` (replicate 2 × shard N/2, the
stand-in for 2 nodes). ``--profile-step N`` profiles step N of every run and writes the step's breakdown
(GPU busy, exposed collectives, idle, host syncs: ``trace_breakdown.py``) to ``<run>/breakdown.md``; the
metric lines around the profiled step are left out of the means. Without a GPU the same runs use CPU
processes (a check of the tool, not a measure).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from titan_delta.trainer.scaling_report import Result, row, summarize, table

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "launch" / "run_single_node.sh"
STRATEGIES = {
    "config": lambda n: [],
    "fsdp": lambda n: ["--parallelism.data_parallel_replicate_degree", "1",
                       "--parallelism.data_parallel_shard_degree", str(n)],
    "fsdp_keep": lambda n: ["--parallelism.data_parallel_replicate_degree", "1",
                            "--parallelism.data_parallel_shard_degree", str(n),
                            "--parallelism.fsdp_reshard_after_forward", "never"],
    "ddp": lambda n: ["--parallelism.data_parallel_replicate_degree", str(n),
                      "--parallelism.data_parallel_shard_degree", "1"],
    "hsdp": lambda n: ["--parallelism.data_parallel_replicate_degree", "2",
                       "--parallelism.data_parallel_shard_degree", str(n // 2)],
}  # fmt: skip
TRACE_BREAKDOWN = REPO / "tools" / "bench" / "trace_breakdown.py"


def family_and_size(args: argparse.Namespace, model: str) -> tuple[str, str]:
    family, _, size = model.partition("@")
    return family, size or args.size


def command(args: argparse.Namespace, model: str, gpus: int, strategy: str, dump: Path) -> list[str]:
    parallel = STRATEGIES[strategy](gpus) if gpus > 1 else []
    batch = ["--training.local_batch_size", str(args.local_batch)] if args.local_batch else []
    profile = []
    if args.profile_step:
        profile = ["--profiling.enable_profiling", "--profiling.profile_freq", str(args.profile_step),
                   "--profiling.profiler_warmup", "2", "--profiling.profiler_active", "1"]  # fmt: skip
    return [
        "bash", str(LAUNCHER),
        "--model.name", family_and_size(args, model)[0], "--job.dump_folder", str(dump),
        "--training.steps", str(args.steps), *batch, "--training.global_batch_size", "-1",
        "--lr_scheduler.warmup_steps", str(min(20, args.steps // 5)), "--checkpoint.no-enable",
        "--eval.no-enable", "--metrics.log_freq", str(args.log_freq), "--metrics.disable_color_printing",
        "--data.sources", "default", *parallel, *profile, *args.extra,
    ]  # fmt: skip


def start(args: argparse.Namespace, model: str, gpus: int, strategy: str, first_gpu: int = 0):
    family, size = family_and_size(args, model)
    name = f"{family}_{size}_{strategy}{gpus}" if gpus > 1 else f"{family}_{size}_1gpu"
    dump = Path(args.out) / name
    dump.mkdir(parents=True, exist_ok=True)
    config = REPO / args.config.format(model=family, size=size)
    env = dict(os.environ, NGPU=str(gpus), CONFIG=str(config), PREFLIGHT="0")
    if args.cuda:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first_gpu + i) for i in range(gpus))
    log = dump / "train.log"
    proc = subprocess.Popen(command(args, model, gpus, strategy, dump), cwd=REPO, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)  # fmt: skip
    return proc, Result(model, strategy if gpus > 1 else "-", gpus, None, None, None, log)


def finish(proc: subprocess.Popen, result: Result, args: argparse.Namespace) -> Result:
    proc.wait()
    skip = (args.profile_step - 2, args.profile_step + args.log_freq) if args.profile_step else None
    summary = summarize(result.log, args.warmup_logs, skip) if proc.returncode == 0 else None
    if summary:
        result.tps, result.mfu, result.memory_gib = summary
    if args.profile_step:
        breakdown(result.log.parent, args.profile_step)
    return result


def breakdown(dump: Path, step: int) -> None:
    """The profiled step's breakdown of rank 0 into ``dump/breakdown.md``; the traces are deleted (large)."""
    traces = dump / "profile_traces"
    trace = traces / f"iteration_{step}" / "rank0_trace.json"
    with (dump / "breakdown.md").open("w") as out:
        if trace.is_file():
            subprocess.run([sys.executable, str(TRACE_BREAKDOWN), str(trace)], stdout=out,
                           stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip
        else:
            out.write(f"no trace at {trace}\n")
    shutil.rmtree(traces, ignore_errors=True)


def run_all(args: argparse.Namespace, report=None) -> list[Result]:
    """Every run; ``report(results)`` after each, so a run cut short still shows what finished."""
    results: list[Result] = []
    width = max(args.available, 1)
    for i in range(0, len(args.models), width):  # 1-GPU baselines, one per GPU
        batch = [start(args, m, 1, "-", first_gpu=j) for j, m in enumerate(args.models[i : i + width])]
        for proc, result in batch:
            results.append(finish(proc, result, args))
            report and report(results)
    for model in args.models:
        for gpus in (g for g in args.gpus if g > 1):
            for strategy in args.strategies:
                if strategy == "hsdp" and gpus % 2:
                    continue
                results.append(finish(*start(args, model, gpus, strategy), args))
                report and report(results)
    return results


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--models", nargs="+", default=["transformer", "deltaformer", "gated_deltaproduct"])
    parser.add_argument("--size", default="340M")
    parser.add_argument("--config", default="train_configs/{model}_{size}.toml", help="config path pattern")
    parser.add_argument("--gpus", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--strategies", nargs="+", default=["fsdp", "ddp", "hsdp"], choices=list(STRATEGIES))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--local-batch", type=int, default=0, help="sequences per GPU (0: the config's)")
    parser.add_argument("--profile-step", type=int, default=0, help="profile this step of every run")
    parser.add_argument("--log-freq", type=int, default=10)
    parser.add_argument("--warmup-logs", type=int, default=2, help="metric lines left out (compilation)")
    parser.add_argument("--out", default="outputs/scaling")
    parser.add_argument("extra", nargs="*", help="more trainer overrides, after --")
    args = parser.parse_args(argv)
    for model in args.models:
        family, size = family_and_size(args, model)
        config = REPO / args.config.format(model=family, size=size)
        if not config.is_file():
            print(f"scaling.py: --models {model} (size {size}): {config} not found", file=sys.stderr)
            return 2
    import torch

    args.cuda = torch.cuda.is_available()
    args.available = torch.cuda.device_count() if args.cuda else 1
    too_many = [g for g in args.gpus if args.cuda and g > args.available]
    if too_many:
        print(f"scaling.py: --gpus {too_many}: only {args.available} GPU(s) here", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0) if args.cuda else "CPU processes"
    batch = args.local_batch or "of each config"
    print(f"scaling: {device}, {args.size}, local batch {batch}, {args.steps} steps", flush=True)
    print("progress rows:", flush=True)
    results = run_all(args, report=lambda done: print(row(done[-1], done), flush=True))
    print("\n" + table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
