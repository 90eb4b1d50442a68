"""Train a zoo model on a state-tracking task with a length curriculum; print a table, write JSON.

    python tools/state_tracking.py --config train_configs/state_tracking/swaps5_deltaformer_round.toml
    python tools/state_tracking.py --config CONFIG --training.steps=500 --model.dim=128 --output out.json
    python tools/state_tracking.py --task.name=parity --curriculum.final_length=32   # defaults + overrides
    python tools/state_tracking.py --summarize a.json b.json                          # table of past runs

Overrides are ``--section.key=value`` (or ``--section.key value``); values parse as TOML literals.
See docs/state_tracking.md for every key.
"""

from __future__ import annotations

import argparse
import json
import sys

from titan_delta.state_tracking import format_table, load_config, run_experiment, write_json


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="TOML experiment config (defaults when omitted)")
    parser.add_argument("--output", help="write the JSON report here (overrides output.json)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="print one table for existing reports")
    args, extra = parser.parse_known_args(argv)
    if args.summarize:
        reports = []
        for path in args.summarize:
            with open(path) as f:
                reports.append(json.load(f))
        print(format_table(reports))
        return 0
    overrides = split_overrides(extra)
    if args.output:
        overrides.append(f"output.json={json.dumps(args.output)}")
    if args.no_progress:
        overrides.append("output.progress=false")
    try:
        config = load_config(args.config, overrides)
    except ValueError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    report = run_experiment(config)
    print(format_table([report]))
    if config.output.json:
        write_json(report, config.output.json)
        print(f"wrote {config.output.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
