"""Packing: rows, shifted labels, -100 at document ends, cu_seqlens over the flat B·T stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.data.helpers import IGNORE, make_loader, random_docs, reference_stream, take, write_jsonl
from titan_delta.data import DataConfig, position_ids_from_cu_seqlens
from titan_delta.data.packing import row_targets, split_text


@pytest.mark.parametrize("add_bos", [False, True])
@pytest.mark.parametrize("masking", [False, True])
def test_rows_labels_and_boundaries_match_reference(tmp_path, tokenizer, masking, add_bos):
    docs = random_docs(40)
    path = write_jsonl(tmp_path / "docs.jsonl", docs)
    seq_len, batch = 37, 3  # odd, so documents are cut at row ends
    config = DataConfig(sources=[f"jsonl:{path}"], lanes=1, num_workers=0, document_masking=masking,
                        add_bos=add_bos, encode_batch_docs=7)
    batches = take(make_loader(config, seq_len, batch, infinite=False, tokenizer=tokenizer), None)
    stream, doc_starts = reference_stream(tokenizer, docs, add_bos)
    rows_total = (len(stream) - 1) // seq_len
    assert len(batches) == rows_total // batch  # the finite tail shorter than a batch is dropped
    for k, (inputs, labels) in enumerate(batches):
        x = inputs["input"]
        assert x.dtype == torch.long and x.shape == (batch, seq_len) and labels.shape == (batch, seq_len)
        base = k * batch * seq_len
        expected_x = stream[base : base + batch * seq_len].reshape(batch, seq_len)
        assert np.array_equal(x.numpy(), expected_x)
        expected_y = stream[base + 1 : base + batch * seq_len + 1].copy()
        if masking:
            for t in range(batch * seq_len):
                if base + t + 1 in doc_starts:
                    expected_y[t] = IGNORE
            assert set(inputs) == {"input", "cu_seqlens"}
            cu = inputs["cu_seqlens"]
            assert cu.dtype == torch.int32
            want = sorted({r * seq_len for r in range(batch)}
                          | {p - base for p in doc_starts if base <= p < base + batch * seq_len}
                          | {batch * seq_len})
            assert cu.tolist() == want
        else:
            assert set(inputs) == {"input"}
        assert np.array_equal(labels.numpy().reshape(-1), expected_y)
    if masking:  # every EOS that has a following document is an ignored label, the token before it is not
        y = torch.cat([lab.reshape(-1) for _, lab in batches])
        x = torch.cat([inp["input"].reshape(-1) for inp, _ in batches])
        eos = (x == tokenizer.eos_id).nonzero().flatten()
        assert len(eos) > 3
        assert (y[eos] == IGNORE).all() and (y[eos - 1] == tokenizer.eos_id).all()


def test_row_targets_by_hand():
    row = np.array([5, 6, 9, 7, 8, 9, 4])  # 9 = EOS; documents start at 3 and 6
    labels, segments = row_targets(row, [3, 6], masking=True)
    assert labels.tolist() == [6, 9, IGNORE, 8, 9, IGNORE]
    assert segments.tolist() == [0, 3]
    labels, segments = row_targets(row, [3, 6], masking=False)
    assert labels.tolist() == [6, 9, 7, 8, 9, 4] and segments.tolist() == [0]


def test_position_ids_restart_at_segments():
    cu = torch.tensor([0, 3, 4, 8, 10, 12], dtype=torch.int32)
    pos = position_ids_from_cu_seqlens(cu, batch=2, seq_len=6)
    assert pos.tolist() == [[0, 1, 2, 0, 0, 1], [2, 3, 0, 1, 0, 1]]


def test_split_text_keeps_every_character():
    text = " ".join(random_docs(30)) + "x" * 500
    pieces = split_text(text, 100)
    assert "".join(pieces) == text and all(len(p) <= 100 for p in pieces) and len(pieces) > 5
