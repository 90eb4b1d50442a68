"""Summary of a suite of runs made by tools/bench/proof_state_tracking.sh: one Markdown page and one JSON
file.

The script runs each config under ``timeout`` and appends one tab-separated line per run to a status file:
``name  config  status  exit_code  seconds  time_limit_s  json_path`` with status ``done`` (exit 0),
``timeout`` (killed by ``timeout``: no report), ``failed`` (other exit code) or ``skipped`` (the budget
was spent before its turn). Runs that finished but whose training hit its time limit are marked by their
reports (``training.cut_short``). Nothing here is estimated: every number comes from a report.

    python -m titan_delta.state_tracking.suite --status STATUS.tsv --markdown OUT.md --json OUT.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from titan_delta.state_tracking.report import combine_reports, format_table, write_json

STATUS_FIELDS = ("name", "config", "status", "exit_code", "seconds", "time_limit_s", "json_path")
STATUSES = ("done", "timeout", "failed", "skipped")


def read_status(path: str | Path) -> list[dict[str, Any]]:
    """Parse the status file; a malformed line is an error naming its line number and the expected fields."""
    runs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        values = line.split("\t")
        if len(values) != len(STATUS_FIELDS) or values[2] not in STATUSES:
            raise ValueError(
                f"{path}:{number}: expected {len(STATUS_FIELDS)} tab-separated fields {STATUS_FIELDS} with "
                f"status in {STATUSES}, got {line!r}"
            )
        run: dict[str, Any] = dict(zip(STATUS_FIELDS, values, strict=True))
        for key in ("exit_code", "seconds"):
            run[key] = int(run[key]) if run[key].lstrip("-").isdigit() else None
        run["time_limit_s"] = float(run["time_limit_s"]) if run["time_limit_s"] else None
        runs.append(run)
    return runs


def _cut_short(report: dict[str, Any]) -> bool:
    runs = report.get("runs", [report])
    return any(
        run["training"].get("cut_short", run["training"]["stopped_by"] == "time_limit") for run in runs
    )


def collect(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Attach each finished run's report (and whether its training was cut short by its time limit)."""
    reports = []
    for run in runs:
        path = Path(run["json_path"]) if run["json_path"] else None
        if run["status"] == "done" and path is not None and path.is_file():
            report = json.loads(path.read_text())
            run["cut_short"] = _cut_short(report)
            reports.append(report)
        else:
            run["cut_short"] = None
    return reports


def _status_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| run | status | exit | seconds | training limit per seed (s) | training cut short |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        cut = {True: "yes", False: "no", None: "—"}[run["cut_short"]]
        limit = "—" if run["time_limit_s"] is None else f"{run['time_limit_s']:.0f}"
        seconds = "—" if run["seconds"] is None else str(run["seconds"])
        exit_code = "—" if run["exit_code"] is None else str(run["exit_code"])
        lines.append(f"| {run['name']} | {run['status']} | {exit_code} | {seconds} | {limit} | {cut} |")
    return "\n".join(lines)


def render_markdown(runs: list[dict[str, Any]], reports: list[dict[str, Any]], budget_s: float | None) -> str:
    first = reports[0] if reports else {}
    lines = ["# State-tracking suite (paper settings)", ""]
    if first:
        lines.append(
            f"Device: {first.get('device_name', first.get('device'))}; torch {first.get('torch_version')}."
        )
    if budget_s is not None:
        lines.append(f"Wall-clock budget: {budget_s:.0f} s for the whole suite.")
    lines += ["", "## Runs", "", _status_table(runs), "", "## Results (mean ± std over seeds)", ""]
    lines.append(format_table(reports) if reports else "No run finished.")
    per_seed = [run for report in reports if "runs" in report for run in report["runs"]]
    if per_seed:
        lines += ["", "## Per seed", "", format_table(per_seed)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--status", required=True, help="tab-separated status file written by the script")
    parser.add_argument("--markdown", required=True, help="write the Markdown summary here")
    parser.add_argument("--json", required=True, help="write the combined JSON here")
    parser.add_argument("--budget-s", type=float, help="the suite's wall-clock budget, recorded as given")
    args = parser.parse_args(argv)
    runs = read_status(args.status)
    reports = collect(runs)
    Path(args.markdown).write_text(render_markdown(runs, reports, args.budget_s))
    status = [{k: v for k, v in run.items() if k != "json_path"} for run in runs]  # temporary paths
    write_json(combine_reports(reports, runs=status, budget_s=args.budget_s), args.json)
    print(f"{len(reports)} of {len(runs)} runs reported; wrote {args.markdown} and {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
