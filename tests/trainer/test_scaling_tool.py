"""tools/bench/scaling.py: metric lines to (tokens/s per GPU, MFU, peak memory), efficiency against 1 GPU."""

from __future__ import annotations

from pathlib import Path

from titan_delta.trainer.scaling_report import Result, summarize, table

LINE = (
    "[rank0]:[titan] - root - INFO - step: {s:2d}  loss: 9.1  grad_norm:  0.3  memory: {m}GiB(8%)  "
    "tps: {t}  tflops: 1.2  mfu: {u}%\n"
)


def _log(tmp_path: Path, rows: list[tuple[int, float, str, float]]) -> Path:
    path = tmp_path / "train.log"
    path.write_text("".join(LINE.format(s=s, m=m, t=t, u=u) for s, m, t, u in rows))
    return path


def test_summary_leaves_out_the_warmup_lines_and_keeps_the_peak_memory(tmp_path: Path) -> None:
    log = _log(tmp_path, [(10, 9.5, "1,000", 5.0), (20, 7.0, "90,000", 30.0), (30, 7.1, "110,000", 32.0)])
    assert summarize(log, warmup_logs=1) == (100_000, 31.0, 9.5)
    assert summarize(log, warmup_logs=3) is None


def test_table_gives_the_efficiency_against_one_gpu(tmp_path: Path) -> None:
    results = [
        Result("deltaformer", "-", 1, 90_000.0, 23.2, 6.9, tmp_path),
        Result("deltaformer", "fsdp", 4, 50_400.0, 13.0, 4.0, tmp_path),
        Result("deltaformer", "ddp", 4, None, None, None, tmp_path / "ddp.log"),
    ]
    rows = table(results).splitlines()
    assert rows[3] == "| deltaformer | fsdp | 4 | 50,400 | 56.0 % | 13.0 | 4.0 |"
    assert rows[4].startswith("| deltaformer | ddp | 4 | FAILED")


def test_summary_leaves_out_the_intervals_a_profiler_slowed(tmp_path: Path) -> None:
    log = _log(tmp_path, [(10, 7.0, "100,000", 30.0), (20, 7.0, "40,000", 12.0), (30, 8.0, "50,000", 14.0),
                          (40, 7.0, "110,000", 32.0)])  # fmt: skip
    assert summarize(log, warmup_logs=0, skip=(18, 30)) == (105_000, 31.0, 8.0)
    assert summarize(log, warmup_logs=0) == (75_000, 22.0, 8.0)
