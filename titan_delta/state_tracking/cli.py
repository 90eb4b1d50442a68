"""Train a zoo model on a state-tracking task with a length curriculum; print a table, write JSON.

    python tools/state_tracking.py --config train_configs/state_tracking/swaps5_deltaformer_round.toml
    python tools/state_tracking.py --config CONFIG --training.steps=500 --model.dim=128 --output out.json
    python tools/state_tracking.py --task.name=parity --curriculum.final_length=32   # defaults + overrides
    python tools/state_tracking.py --config CONFIG --seeds 0,1,2 --device cuda        # three seeds + mean
    python tools/state_tracking.py --summarize a.json b.json                          # table of past runs
    python tools/state_tracking.py --summarize a.json b.json --combine suite.json     # ... and one JSON

Overrides are ``--section.key=value`` (or ``--section.key value``); values parse as TOML literals.
See docs/state_tracking.md for every key.
"""

from __future__ import annotations

import argparse
import json
import sys

from titan_delta.state_tracking import (
    combine_reports,
    format_table,
    load_config,
    run_experiment,
    run_seeds,
    write_json,
)
from titan_delta.state_tracking.report import expand_reports


def split_overrides(extra: list[str]) -> list[str]:
    """``--a.b=1`` / ``--a.b 1`` → ``a.b=1``."""
    overrides, i = [], 0
    while i < len(extra):
        item = extra[i]
        if not item.startswith("--") or "." not in item:
            raise SystemExit(f"unrecognised argument {item!r}: overrides look like --section.key=value")
        if "=" in item:
            overrides.append(item[2:])
            i += 1
        elif i + 1 < len(extra):
            overrides.append(f"{item[2:]}={extra[i + 1]}")
            i += 2
        else:
            raise SystemExit(f"override {item} has no value")
    return overrides


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` → [0, 1, 2]; anything else is a usage error naming --seeds."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise SystemExit(f"--seeds expects comma-separated integers such as 0,1,2, got {text!r}")
    return seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="TOML experiment config (defaults when omitted)")
    parser.add_argument("--output", help="write the JSON report here (overrides output.json)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--seeds", help="comma-separated seeds, one run each, then their mean (training.seeds)"
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="training.device (default auto)")
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="print one table for existing reports")
    parser.add_argument(
        "--combine", metavar="JSON", help="with --summarize: also write the reports as one JSON"
    )
    args, extra = parser.parse_known_args(argv)
    if args.combine and not args.summarize:
        raise SystemExit("--combine needs --summarize and the reports to combine")
    if args.summarize:
        reports = []
        for path in args.summarize:
            with open(path) as f:
                reports.extend(expand_reports(json.load(f)))
        print(format_table(reports))
        if args.combine:
            write_json(combine_reports(reports), args.combine)
        return 0
    overrides = split_overrides(extra)
    if args.seeds:
        overrides.append(f"training.seeds={json.dumps(parse_seeds(args.seeds))}")
    if args.device:
        overrides.append(f"training.device={json.dumps(args.device)}")
    if args.output:
        overrides.append(f"output.json={json.dumps(args.output)}")
    if args.no_progress:
        overrides.append("output.progress=false")
    try:
        config = load_config(args.config, overrides)
    except ValueError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    report = run_seeds(config) if config.training.seeds else run_experiment(config)
    print(format_table([report]))
    if config.output.json:
        write_json(report, config.output.json)
        print(f"wrote {config.output.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
