"""Exact resume, and resume at another data-parallel world size (through a DCP checkpoint)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch.distributed.checkpoint as dcp

from tests.data.helpers import assert_same_batches, make_loader, random_docs, rows_of, take, write_parquet
from titan_delta.data import DataConfig, DataConfigError


@pytest.fixture
def corpus(tmp_path):
    return write_parquet(tmp_path / "corpus.parquet", random_docs(300, max_words=40), row_group_size=32)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exact_resume_text(corpus, tokenizer, num_workers):
    config = DataConfig(sources=[f"parquet:{corpus}"], lanes=8, num_workers=num_workers,
                        document_masking=True, encode_batch_docs=16, prefetch_factor=2)
    n, m = 5, 6  # n odd: the resumed loader must start with the second worker's batch
    full = take(make_loader(config, 24, 3, tokenizer=tokenizer), n + m)
    first = make_loader(config, 24, 3, tokenizer=tokenizer)
    assert_same_batches(take(first, n), full[:n])
    state = copy.deepcopy(first.state_dict())  # workers ran ahead: the state must not count that
    resumed = make_loader(config, 24, 3, tokenizer=tokenizer)
    resumed.load_state_dict(state)
    assert_same_batches(take(resumed, m), full[n:])


def save_ranks_then_resume(tmp_path, config, tokenizer, old_world, new_world, steps, seq_len=20,
                           new_workers=None):
    """Run ``old_world`` ranks for ``steps`` batches, checkpoint with DCP, resume on ``new_world`` ranks
    and run all of them to the end of the (finite) data; returns the rows seen before and after."""
    new_config = replace(config, num_workers=config.num_workers if new_workers is None else new_workers)
    loaders = [make_loader(config, seq_len, 1, r, old_world, infinite=False, tokenizer=tokenizer)
               for r in range(old_world)]
    before = [b for loader in loaders for b in take(loader, steps)]
    # What DCP stores from all old ranks: disjoint per-lane keys plus the replicated layout.
    merged = {}
    for loader in loaders:
        merged.update(loader.state_dict())
    dcp.save({"dataloader": merged}, checkpoint_id=str(tmp_path / "ckpt"))
    after = []
    for r in range(new_world):
        loader = make_loader(new_config, seq_len, 1, r, new_world, infinite=False, tokenizer=tokenizer)
        template = {"dataloader": loader.state_dict()}
        dcp.load(template, checkpoint_id=str(tmp_path / "ckpt"))
        loader.load_state_dict(template["dataloader"])
        after += take(loader, None)
    return before, after


@pytest.mark.parametrize(("old_world", "new_world", "old_workers", "new_workers"),
                         [(2, 3, 0, 0), (4, 1, 0, 0), (1, 2, 2, 0)])
def test_resume_at_other_world_size_covers_every_row_once(tmp_path, corpus, tokenizer, old_world, new_world,
                                                          old_workers, new_workers):
    config = DataConfig(sources=[f"parquet:{corpus}"], lanes=12, num_workers=old_workers,
                        document_masking=True, encode_batch_docs=8, prefetch_factor=2)
    reference = rows_of(take(make_loader(config, 20, 1, infinite=False, tokenizer=tokenizer), None))
    before, after = save_ranks_then_resume(tmp_path, config, tokenizer, old_world, new_world, steps=7,
                                           new_workers=new_workers)
    assert len(before) == 7 * old_world
    assert rows_of(before) + rows_of(after) == reference
    assert sum(reference.values()) > 100


def test_resume_rejects_other_layout(corpus, tokenizer):
    config = DataConfig(sources=[f"parquet:{corpus}"], lanes=8, num_workers=0)
    state = make_loader(config, 16, 2, tokenizer=tokenizer).state_dict()
    other = make_loader(config, 32, 2, tokenizer=tokenizer)
    with pytest.raises(DataConfigError, match="does not match"):
        other.load_state_dict(state)
    with pytest.raises(DataConfigError, match="lanes=8 must be >= dp_world_size"):
        make_loader(DataConfig(sources=[f"parquet:{corpus}"], lanes=8, num_workers=3), 16, 2, 0, 4,
                    tokenizer=tokenizer)
