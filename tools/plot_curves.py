#!/usr/bin/env python
"""Plot several runs' validation and training loss curves (TensorBoard logs) to compare them at equal tokens.

Example::

    python tools/plot_curves.py runs/deltaformer runs/transformer --out-dir plots --tokens-per-step 524288

writes one PNG per tag (``plots/validation_loss.png``, ...) with every run as a line, and prints a Markdown
table (last step, final value of each tag, lowest validation loss and its step), also saved as
``plots/summary.md``. Each RUN_DIR is a training dump folder: its event files are read from
``RUN_DIR/tb/**`` (``[metrics] save_tb_folder``; a resumed run adds one timestamped folder per start).
"""

from __future__ import annotations

import argparse
import glob
import logging
import math
import os
import re
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# tensorboard's event reader logs every file it opens at INFO: noise on the tool's stderr, which carries
# only the one-line errors
logging.getLogger("tensorboard").setLevel(logging.WARNING)

try:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on training nodes or CI
    import matplotlib.pyplot as plt
except ImportError:  # a dev dependency: say how to get it instead of a traceback
    plt = None

VALIDATION_LOSS = "validation/loss"
DEFAULT_TAGS = [VALIDATION_LOSS, "validation/bpb", "loss_metrics/global_avg_loss"]
Curve = dict[int, float]  # step -> value


class UsageError(Exception):
    """A bad argument or run folder: reported as one line on stderr, exit code 2."""


def read_run(run_dir: Path, tb_folder: str) -> dict[str, Curve]:
    """Every scalar tag of one dump folder as {tag: {step: value}}."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: folder not found (expected a training dump folder)")
    tb_root = run_dir / tb_folder
    event_dirs = sorted({os.path.dirname(p) for p in glob.glob(f"{glob.escape(str(tb_root))}/**/events.*",
                                                                recursive=True)})
    if not event_dirs:
        raise UsageError(f"{tb_root}: no TensorBoard event files (expected events.* written by a run "
                         f"with [metrics] enable_tensorboard)")
    curves: dict[str, Curve] = {}
    # Folders are named by start time, so sorted order is run order: when a resumed run logs a step
    # again (it restarted from an older checkpoint), the later value is the one that counts.
    for event_dir in event_dirs:
        accumulator = EventAccumulator(event_dir, size_guidance={"scalars": 0})  # 0 = keep every point
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            curves.setdefault(tag, {}).update({e.step: e.value for e in accumulator.Scalars(tag)})
    return curves


def tokens_axis(tokens_per_step: int, last_step: int) -> tuple[float, str]:
    """Divisor and axis label: billions once a run passes 1e9 tokens, else millions."""
    if tokens_per_step * last_step >= 1e9:
        return 1e9, "tokens (billions)"
    return 1e6, "tokens (millions)"


def plot_tag(tag: str, curves: dict[str, Curve], path: Path, tokens_per_step: int | None) -> None:
    """One PNG: every run that logged ``tag`` as a line on one axes."""
    figure, axes = plt.subplots(figsize=(8, 5))
    last_step = max(max(curve) for curve in curves.values())
    divisor, x_label = tokens_axis(tokens_per_step, last_step) if tokens_per_step else (1.0, "step")
    for label, curve in curves.items():
        steps = sorted(curve)
        xs = [step * (tokens_per_step or 1) / divisor for step in steps]
        # validation runs only every few hundred steps: markers keep a sparse curve readable
        axes.plot(xs, [curve[s] for s in steps], label=label, marker="o" if len(steps) <= 50 else None,
                  markersize=3)
    axes.set_xlabel(x_label)
    axes.set_ylabel(tag)
    axes.set_title(tag)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def summary_table(runs: dict[str, dict[str, Curve]], tags: list[str], tokens_per_step: int | None) -> str:
    """Markdown: per run its last step, each tag's final value, and the lowest validation loss."""
    with_minimum = VALIDATION_LOSS in tags
    header = ["run", "last step"] + (["tokens"] if tokens_per_step else []) + [f"final {t}" for t in tags]
    if with_minimum:
        header += [f"min {VALIDATION_LOSS}", "at step"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, curves in runs.items():
        # a run may hold none of the tags (it logged no validation): a row of dashes, not a crash
        last_step = max((max(curves[t]) for t in tags if curves.get(t)), default=None)
        cells = [label, "-" if last_step is None else str(last_step)]
        if tokens_per_step:
            cells.append("-" if last_step is None else f"{last_step * tokens_per_step:,}")
        cells += [f"{curves[t][max(curves[t])]:.4f}" if curves.get(t) else "-" for t in tags]
        if with_minimum:
            finite = {s: v for s, v in curves.get(VALIDATION_LOSS, {}).items() if math.isfinite(v)}
            best = min(finite, key=finite.__getitem__) if finite else None  # earliest step on a tie
            cells += [f"{finite[best]:.4f}", str(best)] if best is not None else ["-", "-"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def run_labels(run_dirs: list[Path], labels: list[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(run_dirs):
            raise UsageError(f"--labels: {len(labels)} names for {len(run_dirs)} runs "
                             f"(expected one name per RUN_DIR)")
        return labels
    names = [path.resolve().name for path in run_dirs]
    # two runs called e.g. .../a/dump and .../b/dump: fall back to the paths as given, which differ
    return names if len(set(names)) == len(names) else [str(path) for path in run_dirs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="a run's dump folder")
    parser.add_argument("--out-dir", type=Path, required=True, help="where the PNGs and summary.md go")
    parser.add_argument("--tags", nargs="+", default=DEFAULT_TAGS, metavar="TAG",
                        help=f"scalar tags to plot (default: {' '.join(DEFAULT_TAGS)})")
    parser.add_argument("--labels", nargs="+", default=None, metavar="NAME",
                        help="one legend name per RUN_DIR (default: the folder names)")
    parser.add_argument("--tokens-per-step", type=int, default=None, metavar="N",
                        help="x axis in tokens (step x N) instead of steps: global batch x seq_len")
    parser.add_argument("--tb-folder", default="tb", help="[metrics] save_tb_folder of the runs")
    args = parser.parse_args(argv)
    try:
        if plt is None:
            raise UsageError("matplotlib: not installed (expected: pip install -e '.[dev]' or pip install "
                             "matplotlib)")
        if args.tokens_per_step is not None and args.tokens_per_step <= 0:
            raise UsageError(f"--tokens-per-step: {args.tokens_per_step} (expected a positive integer)")
        labels = run_labels(args.run_dirs, args.labels)
        runs = {label: read_run(path, args.tb_folder)
                for label, path in zip(labels, args.run_dirs, strict=True)}
        tags = [tag for tag in dict.fromkeys(args.tags) if any(curves.get(tag) for curves in runs.values())]
        if not tags:
            raise UsageError(f"--tags: none of {', '.join(args.tags)} is in any run (expected at least one)")
        try:
            args.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            message = f"--out-dir {args.out_dir}: {err.strerror} (expected a folder to write to)"
            raise UsageError(message) from err
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for tag in args.tags:
        if tag not in tags:
            print(f"note: {tag}: in no run, skipped", file=sys.stderr)
    for tag in tags:
        curves = {label: run[tag] for label, run in runs.items() if run.get(tag)}
        plot_tag(tag, curves, args.out_dir / (re.sub(r"[^\w.-]+", "_", tag) + ".png"), args.tokens_per_step)
    table = summary_table(runs, tags, args.tokens_per_step)
    (args.out_dir / "summary.md").write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
