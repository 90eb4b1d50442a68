"""Equal-token comparison of model families: the same data in the same order, the same tokens and batch,
validation loss curves, final validation loss, tokens/s and the offline lm-eval tasks, in one table.

    python tools/bench/compare_families.py --size 340M --tokens 2e8 --out outputs/compare \\
        --data "parquet:/data/offline_corpus/train/*.parquet" \\
        --heldout "parquet:/data/offline_corpus/heldout/*.parquet" \\
        --runs transformer deltaformer gated_deltaproduct:gdp_num_householder=1 gated_deltaproduct \\
               gated_deltaproduct:gdp_num_householder=3 deltaformer_swa gated_deltaproduct_swa

A run is ``family[:field=value,...]``: ``train_configs/<family>_<size>.toml`` (``--config`` changes the
pattern) with ``--model.<field> value`` for each pair, trained through ``launch/run_single_node.sh`` on
``--gpus-per-run`` GPUs; runs go side by side while GPUs are free. Every run gets the same seed, data,
global batch (``--global-batch`` sequences of the config's ``seq_len``) and step count (``--tokens`` /
tokens per step, rounded up), validation every ``--val-freq`` steps on ``--heldout``, lm-eval on the
shipped offline tasks after the last step, no checkpoints. Then ``tools/plot_curves.py`` draws the curves
(``OUT/plots/*.png``) and ``OUT/results.md`` gets one row per run: steps, tokens, final and lowest
validation loss, final validation bits per byte, tokens/s per GPU (mean of the log lines after the first
``--warmup-logs``), peak memory, the device and each lm-eval metric, then every run's validation loss
every ``--table-every`` steps. Without a GPU the runs use CPU
processes (a check of the tool, not a measure). Each run folder keeps ``exit_code`` and ``device.txt``, so
``--report-only`` rebuilds ``results.md`` and the plots from run folders trained by earlier invocations
(e.g. on several machines, copied into one ``--out``; tokens/s compare only between rows of one device).
A run folder without ``exit_code`` but with a ``train.log`` (a run stopped from outside, e.g. at a time
limit) gets an INCOMPLETE row: the step it reached, its curves, no lm-eval. Exit code 1 unless every run
finished with exit code 0 (the rows say which did not), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from titan_delta.trainer.scaling_report import METRICS, summarize

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "launch" / "run_single_node.sh"
PLOT = REPO / "tools" / "plot_curves.py"


def parse_run(spec: str) -> tuple[str, list[str]]:
    """``family:a=1,b=2`` -> (family, ["--model.a", "1", "--model.b", "2"])."""
    family, _, fields = spec.partition(":")
    overrides = []
    for pair in filter(None, fields.split(",")):
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--runs {spec}: expected family[:field=value,...], got {pair!r}")
        overrides += [f"--model.{name}", value]
    return family, overrides


def label(spec: str) -> str:
    return spec.replace(":", "_").replace("=", "").replace(",", "_")


def command(args: argparse.Namespace, spec: str, steps: int, dump: Path) -> list[str]:
    family, overrides = parse_run(spec)
    return [
        "bash", str(LAUNCHER), "--model.name", family, *overrides, "--job.dump_folder", str(dump),
        "--training.steps", str(steps), "--training.global_batch_size", str(args.global_batch),
        "--training.local_batch_size", str(args.local_batch), "--training.seed", str(args.seed),
        "--lr_scheduler.warmup_steps", str(min(args.warmup_steps, steps)),
        "--data.sources", args.data, "--checkpoint.no-enable", "--metrics.log_freq", str(args.log_freq),
        "--metrics.disable_color_printing", "--metrics.enable_tensorboard",
        "--validation.enable", "--validation.dataset_path", args.heldout,
        "--validation.freq", str(args.val_freq), "--validation.steps", str(args.val_steps),
        "--eval.enable", "--eval.interval", "0", "--eval.at_end", "--eval.tasks", "local",
        *args.extra,
    ]  # fmt: skip


def tokens_per_step(args: argparse.Namespace, config: Path) -> int:
    import tomllib

    seq_len = tomllib.loads(config.read_text()).get("training", {}).get("seq_len", 2048)
    return args.global_batch * int(seq_len)


def run_all(args: argparse.Namespace, steps: int) -> dict[str, int]:
    """Trains every run, as many at once as the GPUs allow; returns each run's exit code."""
    slots = max(1, args.available // args.gpus_per_run)
    pending, running, codes = list(args.runs), [], {}
    while pending or running:
        while pending and len(running) < slots:
            spec = pending.pop(0)
            used = {slot for _, _, slot in running}
            slot = next(s for s in range(slots) if s not in used)
            family, _ = parse_run(spec)
            dump = Path(args.out) / label(spec)
            dump.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, NGPU=str(args.gpus_per_run), PREFLIGHT="0",
                       CONFIG=str(REPO / args.config.format(model=family, size=args.size)))  # fmt: skip
            if args.cuda:
                first = slot * args.gpus_per_run
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(args.gpus_per_run))
            (dump / "device.txt").write_text(f"{device_name(args)} x{args.gpus_per_run}\n")
            log = (dump / "train.log").open("w")
            proc = subprocess.Popen(command(args, spec, steps, dump), cwd=REPO, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
            running.append((spec, proc, slot))
            print(f"started {spec} (steps {steps}) -> {dump}", flush=True)
        spec, proc, slot = running.pop(0)
        codes[spec] = proc.wait()
        (Path(args.out) / label(spec) / "exit_code").write_text(f"{codes[spec]}\n")
        print(f"finished {spec}: exit code {codes[spec]}", flush=True)
    return codes


def device_name(args: argparse.Namespace) -> str:
    import torch

    return torch.cuda.get_device_name(0) if args.cuda else "CPU"


def recorded_codes(args: argparse.Namespace) -> dict[str, int]:
    """Exit codes of runs trained earlier (``exit_code`` in each run folder); runs without one left out."""
    codes = {}
    for spec in args.runs:
        path = Path(args.out) / label(spec) / "exit_code"
        if path.is_file():
            codes[spec] = int(path.read_text())
    return codes


def eval_metrics(dump: Path) -> dict[str, float]:
    """The last eval's metrics per ``task/metric`` (``[eval] results_file``)."""
    path = dump / "eval" / "results.jsonl"
    if not path.is_file():
        return {}
    last: dict[str, float] = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        for name, value in entry.get("metrics", {}).items():
            if isinstance(value, int | float):
                last[f"{entry['task']}/{name}"] = float(value)
    return last


def curve_summary(args: argparse.Namespace, dumps: list[Path], step_tokens: int) -> dict[str, dict[str, str]]:
    """Draws the curves (tools/plot_curves.py); returns its summary table as {run folder: {column: cell}}."""
    plots = Path(args.out) / "plots"
    cmd = [sys.executable, str(PLOT), *map(str, dumps), "--out-dir", str(plots), "--tokens-per-step",
           str(step_tokens)]  # fmt: skip
    plot = subprocess.run(cmd, capture_output=True, text=True)
    if plot.returncode:
        print(f"plot_curves.py: {plot.stderr.strip()}", file=sys.stderr)
        return {}
    lines = [line for line in plot.stdout.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]
    return {row[0]: dict(zip(header, row, strict=False)) for row in rows}


VALIDATION_LINE = re.compile(r"validation at step (\d+): loss ([0-9.]+)")
CURVE_COLUMNS = ("final validation/loss", "min validation/loss", "at step", "final validation/bpb")


def last_step(log: Path) -> int | None:
    """The last step a run's train.log reports a metrics line for (None without one)."""
    if not log.is_file():
        return None
    steps = [int(m.group(1)) for m in METRICS.finditer(log.read_text(errors="replace"))]
    return steps[-1] if steps else None


def validation_losses(log: Path) -> dict[int, float]:
    """{step: validation loss} from a run's train.log (rank 0's lines)."""
    if not log.is_file():
        return {}
    text = log.read_text(errors="replace")
    return {int(m.group(1)): float(m.group(2)) for m in VALIDATION_LINE.finditer(text)}


def validation_table(args: argparse.Namespace, every: int) -> str:
    """Validation loss of every run at each multiple of ``every`` steps and at each run's last validation."""
    losses = {spec: validation_losses(Path(args.out) / label(spec) / "train.log") for spec in args.runs}
    steps = sorted({s for run in losses.values() for s in run if s % every == 0}
                   | {max(run) for run in losses.values() if run})  # fmt: skip
    if not steps:
        return ""
    rows = ["| step | " + " | ".join(args.runs) + " |", "|---|" + "---|" * len(args.runs)]
    for step in steps:
        cells = [f"{losses[spec][step]:.4f}" if step in losses[spec] else "—" for spec in args.runs]
        rows.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def report(args: argparse.Namespace, steps: int, step_tokens: int, codes: dict[str, int]) -> str:
    """Plots the curves and returns the results table (Markdown). A run with no exit code but a train.log
    (stopped from outside, e.g. at a time limit) gets an INCOMPLETE row with what it logged and its curves."""
    dumps = [Path(args.out) / label(spec) for spec in args.runs]
    reached = {spec: last_step(d / "train.log") for spec, d in zip(args.runs, dumps, strict=True)}
    shown = [d for spec, d in zip(args.runs, dumps, strict=True)
             if codes.get(spec) == 0 or (spec not in codes and reached[spec])]  # fmt: skip
    curves = curve_summary(args, shown, step_tokens) if shown else {}
    evals = {d.name: eval_metrics(d) for d in shown}
    metric_names = sorted({name for m in evals.values() for name in m})
    head = ["run", "steps", "tokens", "tokens/s per GPU", "peak GiB", "device", *CURVE_COLUMNS, *metric_names]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec, dump in zip(args.runs, dumps, strict=True):
        if spec not in codes and not reached[spec]:
            rows.append(f"| {spec} | NOT RUN (no {dump / 'exit_code'}) |")
            continue
        if spec in codes and codes[spec] != 0:
            rows.append(f"| {spec} | FAILED (exit {codes[spec]}, {dump / 'train.log'}) |")
            continue
        done = steps if spec in codes else reached[spec]
        step_cell = str(steps) if spec in codes else f"INCOMPLETE: {done} of {steps}"
        summary = summarize(dump / "train.log", args.warmup_logs)
        speed = [f"{summary[0]:,.0f}", f"{summary[2]:.1f}"] if summary else ["-", "-"]
        curve = [curves.get(dump.name, {}).get(column, "-") for column in CURVE_COLUMNS]
        values = [f"{evals[dump.name][n]:.4f}" if n in evals[dump.name] else "-" for n in metric_names]
        device = (dump / "device.txt").read_text().strip() if (dump / "device.txt").is_file() else "-"
        cells = [spec, step_cell, f"{done * step_tokens:,}", *speed, device, *curve, *values]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--runs", nargs="+", required=True, help="family[:field=value,...] per run")
    parser.add_argument("--size", default="340M")
    parser.add_argument("--config", default="train_configs/{model}_{size}.toml", help="config path pattern")
    parser.add_argument("--tokens", type=float, required=True, help="training tokens per run")
    parser.add_argument("--global-batch", type=int, default=64, help="sequences per step, every run")
    parser.add_argument("--local-batch", type=int, default=16, help="sequences per GPU and micro-batch")
    parser.add_argument("--gpus-per-run", type=int, default=1)
    parser.add_argument("--data", required=True, help="[data] sources spelling of the training text")
    parser.add_argument("--heldout", required=True, help="[validation] dataset_path of the held-out text")
    parser.add_argument("--val-freq", type=int, default=100)
    parser.add_argument("--val-steps", type=int, default=20)
    parser.add_argument(
        "--table-every",
        type=int,
        default=0,
        help="steps between rows of the validation-loss table (default 2 x --val-freq)",
    )
    parser.add_argument("--warmup-steps", type=int, default=200, help="learning-rate warm-up (every run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-freq", type=int, default=10)
    parser.add_argument("--warmup-logs", type=int, default=2, help="log lines left out of tokens/s")
    parser.add_argument("--out", default="outputs/compare")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: results.md and plots from the run folders already in --out",
    )
    parser.add_argument("extra", nargs="*", help="more trainer overrides for every run, after --")
    args = parser.parse_args(argv)
    try:
        for spec in args.runs:
            parse_run(spec)
    except ValueError as e:
        print(f"compare_families.py: {e}", file=sys.stderr)
        return 2
    families = {parse_run(spec)[0] for spec in args.runs}
    configs = {f: REPO / args.config.format(model=f, size=args.size) for f in sorted(families)}
    problem = next((f"--runs: {c} not found" for c in configs.values() if not c.is_file()), None)
    if problem is None and args.tokens <= 0:
        problem = f"--tokens {args.tokens}: expected > 0"
    batches = args.global_batch, args.local_batch
    if problem is None and (min(batches) < 1 or args.global_batch % args.local_batch):
        problem = f"--global-batch {batches[0]}: expected a positive multiple of --local-batch {batches[1]}"
    if problem:
        print(f"compare_families.py: {problem}", file=sys.stderr)
        return 2
    import torch

    args.cuda = torch.cuda.is_available()
    args.available = torch.cuda.device_count() if args.cuda else args.gpus_per_run
    step_tokens = {tokens_per_step(args, c) for c in configs.values()}
    if len(step_tokens) != 1:
        print(f"compare_families.py: the configs' seq_len differ ({sorted(step_tokens)} tokens per step)",
              file=sys.stderr)  # fmt: skip
        return 2
    step_tokens_value = step_tokens.pop()
    steps = math.ceil(args.tokens / step_tokens_value)
    codes = recorded_codes(args) if args.report_only else run_all(args, steps)
    table = report(args, steps, step_tokens_value, codes)
    curve = validation_table(args, args.table_every or 2 * args.val_freq)
    if curve:
        table += f"\n\nValidation loss by step ({step_tokens_value:,} tokens per step):\n\n{curve}"
    (Path(args.out) / "results.md").write_text(table + "\n")
    print(table)
    return 0 if all(codes.get(spec) == 0 for spec in args.runs) else 1


if __name__ == "__main__":
    sys.exit(main())
