"""tools/plot_curves.py on hand-written TensorBoard logs laid out like the trainer's: PNGs, table, errors."""

from __future__ import annotations

import runpy
import struct
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

TOOL = Path(__file__).resolve().parents[2] / "tools" / "plot_curves.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tool() -> dict:
    """The tool's functions, loaded by path (tests do not import tools)."""
    return runpy.run_path(str(TOOL))


def _write(dump: Path, stamp: str, scalars: dict[str, dict[int, float]]) -> None:
    """Event file where the trainer writes it: ``<dump>/tb/<start time>/``."""
    writer = SummaryWriter(str(dump / "tb" / stamp))
    for tag, curve in scalars.items():
        for step, value in curve.items():
            writer.add_scalar(tag, value, step)
    writer.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    deltaformer, transformer = root / "deltaformer", root / "transformer"
    _write(deltaformer, "20250101-1200", {
        "validation/loss": {10: 3.5, 20: 3.0, 30: 3.25},
        "validation/bpb": {10: 1.5, 20: 1.25, 30: 1.375},
        "loss_metrics/global_avg_loss": {s: 4.0 - s / 20 for s in range(1, 31)},
    })  # fmt: skip
    # resumed from the step-20 checkpoint: steps 21-30 are logged again, the second start's values count
    _write(deltaformer, "20250101-1300", {
        "validation/loss": {30: 2.75, 40: 2.875},
        "validation/bpb": {30: 1.125, 40: 1.0625},
        "loss_metrics/global_avg_loss": {s: 3.0 - s / 100 for s in range(21, 41)},
    })  # fmt: skip
    # no bits per byte in this one
    _write(transformer, "20250102-0900", {
        "validation/loss": {10: 3.75, 20: 3.5},
        "loss_metrics/global_avg_loss": {s: 4.5 - s / 10 for s in range(1, 21)},
    })  # fmt: skip
    return deltaformer, transformer


def _table(text: str) -> dict[str, dict[str, str]]:
    """Markdown table → {run: {column: cell}}."""
    lines = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.strip().splitlines()]
    return {cells[0]: dict(zip(lines[0], cells, strict=True)) for cells in lines[2:]}


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000, path
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def test_plots_and_table_of_two_runs(tool, runs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "plots"
    assert tool["main"]([*map(str, runs), "--out-dir", str(out)]) == 0
    captured = capsys.readouterr()
    for name in ("validation_loss", "validation_bpb", "loss_metrics_global_avg_loss"):
        assert _png_size(out / f"{name}.png") == (960, 600)
    assert (out / "summary.md").read_text() == captured.out
    rows = _table(captured.out)
    assert rows["deltaformer"] == {
        "run": "deltaformer", "last step": "40", "final validation/loss": "2.8750",
        "final validation/bpb": "1.0625", "final loss_metrics/global_avg_loss": "2.6000",
        "min validation/loss": "2.7500", "at step": "30",
    }  # fmt: skip
    # the tag it lacks is a dash, the others are its own
    assert rows["transformer"]["final validation/bpb"] == "-"
    assert rows["transformer"]["final validation/loss"] == "3.5000"
    assert rows["transformer"]["last step"] == "20"
    assert (rows["transformer"]["min validation/loss"], rows["transformer"]["at step"]) == ("3.5000", "20")
    assert captured.err == ""


def test_tokens_per_step_and_labels(tool, runs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "plots"
    argv = [*map(str, runs), "--out-dir", str(out), "--tokens-per-step", "4096", "--labels", "DF", "TF",
            "--tags", "validation/loss"]  # fmt: skip
    assert tool["main"](argv) == 0
    rows = _table(capsys.readouterr().out)
    assert rows["DF"]["tokens"] == f"{40 * 4096:,}" and rows["TF"]["tokens"] == f"{20 * 4096:,}"
    assert sorted(p.name for p in out.iterdir()) == ["summary.md", "validation_loss.png"]
    _png_size(out / "validation_loss.png")
    assert tool["tokens_axis"](4096, 40) == (1e6, "tokens (millions)")
    assert tool["tokens_axis"](524288, 2000) == (1e9, "tokens (billions)")


def test_a_tag_in_no_run_is_skipped_with_a_note(tool, runs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "plots"
    argv = [str(runs[1]), "--out-dir", str(out), "--tags", "validation/bpb", "validation/loss"]
    assert tool["main"](argv) == 0
    captured = capsys.readouterr()
    assert captured.err == "note: validation/bpb: in no run, skipped\n"
    assert not (out / "validation_bpb.png").exists() and (out / "validation_loss.png").is_file()
    assert "bpb" not in captured.out


def _error(tool, capsys, argv: list[str]) -> str:
    assert tool["main"](argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    return captured.err.strip()


def test_errors_are_one_line_and_exit_2(tool, runs, tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "plots")
    missing = tmp_path / "gone"
    assert _error(tool, capsys, [str(runs[0]), str(missing), "--out-dir", out]) == (
        f"error: {missing}: folder not found (expected a training dump folder)"
    )
    empty = tmp_path / "empty"
    (empty / "tb").mkdir(parents=True)
    message = _error(tool, capsys, [str(empty), "--out-dir", out])
    assert message.startswith(f"error: {empty / 'tb'}: no TensorBoard event files"), message
    message = _error(tool, capsys, [*map(str, runs), "--out-dir", out, "--labels", "only-one"])
    assert message.startswith("error: --labels: 1 names for 2 runs"), message
    message = _error(tool, capsys, [str(runs[0]), "--out-dir", out, "--tags", "train/nothing"])
    assert message.startswith("error: --tags: none of train/nothing is in any run"), message
    assert not (tmp_path / "plots").exists()
