"""Configs: shipped files load, overrides parse, bad values name their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from titan_delta.state_tracking.config import load_config, parse_override

CONFIG_DIR = Path(__file__).resolve().parents[2] / "train_configs" / "state_tracking"


@pytest.mark.parametrize(
    "path", sorted(CONFIG_DIR.rglob("*.toml")), ids=lambda p: str(p.relative_to(CONFIG_DIR).with_suffix(""))
)
def test_shipped_configs_load(path: Path) -> None:
    config = load_config(path)
    assert config.output.json.endswith(f"{path.relative_to(CONFIG_DIR).with_suffix('.json')}")
    assert config.curriculum.final_length in config.eval_lengths()


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "paper").glob("*.toml")), ids=lambda p: p.stem)
def test_paper_configs_say_which_values_are_assumed(path: Path) -> None:
    """Each paper-scale config names its paper and figure and marks what is assumed; it runs several seeds
    and has a reduced CPU sibling of the same name."""
    header = path.read_text().split("[task]")[0]
    assert "paper" in header and "Fig." in header and "ASSUMED" in header
    assert len(load_config(path).training.run_seeds()) > 1
    assert (CONFIG_DIR / path.name).is_file()


def test_overrides_parse_as_toml_literals() -> None:
    assert parse_override("training.steps=7") == ("training", "steps", 7)
    assert parse_override("eval.lengths=[8, 16]") == ("eval", "lengths", [8, 16])
    assert parse_override("task.group=S4") == ("task", "group", "S4")
    config = load_config(
        None, ["task.name=word_problem", "task.group=A5", "model.rope=false", "training.lr=1"]
    )
    assert config.task.options == {"group": "A5"} and not config.model.rope and config.training.lr == 1.0


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("training.stpes=3", "training.stpes"),
        ("training.steps=0", "training.steps"),
        ("training.batch_size=2.5", "training.batch_size"),
        ("curriculum.start_length=32", "curriculum.start_length"),
        ("model.vocab_size=10", "model.vocab_size"),
        ("model.heads=4", "model.heads"),
        ("model.mixer=mamba", "mixer must be one of"),
        ("task.group=S4", "task.group"),
        ("optim.lr=1", "optim"),
        ("training.device=tpu", "training.device"),
    ],
)
def test_bad_settings_name_their_key(override: str, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_override_without_a_section_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"section\.key=value"):
        parse_override("steps=3")
