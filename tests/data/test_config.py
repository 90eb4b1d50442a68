"""The ``[data]`` section merges into torchtitan's JobConfig and reaches the builders."""

from __future__ import annotations

import pytest
from torchtitan.config import ConfigManager

from titan_delta.data import DataConfig, DataConfigError, TitanDataLoader, build_dataloader, build_tokenizer
from titan_delta.data.config import data_config_from


def test_toml_data_section_through_torchtitan(tmp_path):
    toml = tmp_path / "job.toml"
    toml.write_text(
        '[job]\ncustom_config_module = "titan_delta.data.config"\n'
        "[training]\nseq_len = 32\nlocal_batch_size = 2\n"
        '[data]\nsources = ["default"]\ndocument_masking = true\nnum_workers = 0\nlanes = 4\n'
    )
    job = ConfigManager().parse_args(["--job.config_file", str(toml), "--data.seed=3"])
    assert isinstance(job.data, DataConfig) and job.data.seed == 3 and job.data.document_masking
    tokenizer = build_tokenizer(job)
    loader = build_dataloader(dp_world_size=2, dp_rank=1, tokenizer=tokenizer, job_config=job)
    assert isinstance(loader, TitanDataLoader)
    inputs, labels = next(iter(loader))
    assert inputs["input"].shape == labels.shape == (2, 32)
    assert inputs["cu_seqlens"][-1] == 64
    assert sorted(loader.dataset.cursors) == [1, 3]  # rank 1 of 2 owns lanes 1 and 3


def test_defaults_when_the_section_is_absent():
    class Bare:
        pass

    assert data_config_from(Bare()) == DataConfig()
    with pytest.raises(DataConfigError, match=r"data\.lanes must be >= 1"):
        DataConfig(lanes=0).validate()
