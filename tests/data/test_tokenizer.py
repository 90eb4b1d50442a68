"""The shipped BPE and the tokenizer loaders: round trip, special tokens, clear errors."""

from __future__ import annotations

import base64

import pytest
import tiktoken
import torch

from titan_delta.data import DataConfigError, load_tokenizer
from titan_delta.data.sources import DEFAULT_CORPUS
from titan_delta.data.tokenizer import DEFAULT_TOKENIZER


def test_shipped_tokenizer_ids_and_round_trip(tokenizer):
    assert tokenizer.get_vocab_size() == 16384
    assert (tokenizer.eos_id, tokenizer.bos_id) == (16382, 16383)
    # Random unicode (incl. astral planes and the literal special-token text) must survive a round trip.
    codepoints = torch.randint(32, 0x2FFFF, (400,)).tolist()
    text = "".join(chr(c) for c in codepoints if not 0xD800 <= c < 0xE000) + " <|endoftext|> \n\t x"
    ids = tokenizer.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
    assert tokenizer.eos_id not in ids[1:-1], "special-token text inside a document must stay text"
    assert tokenizer.decode(ids[1:-1]) == text


def test_batch_encoding_matches_single(tokenizer):
    import pyarrow.parquet as pq

    texts = pq.read_table(DEFAULT_CORPUS, columns=["text"]).column("text").to_pylist()
    pick = torch.randint(0, len(texts), (12,)).tolist()
    sample = [texts[i][:5000] for i in pick]
    batch = tokenizer.encode_ordinary_batch(sample)
    assert [b.tolist() for b in batch] == [tokenizer.encode(t) for t in sample]
    assert all(tokenizer.decode(b) == t for b, t in zip(batch, sample, strict=True))
    # Compression on real text: the 16k BPE averages > 3.5 bytes per token on the corpus it ships with.
    assert sum(len(t.encode()) for t in sample) / sum(len(b) for b in batch) > 3.5


def test_ranks_file_loads_with_plain_tiktoken():
    """The shipped .tiktoken file is standard: tiktoken's own loader reads it."""
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(DEFAULT_TOKENIZER))
    assert len(ranks) == 16382 and ranks[b"a"] == ord("a")


def test_ranks_file_without_sidecar_needs_pattern(tmp_path):
    target = tmp_path / "mine.tiktoken"
    target.write_bytes(DEFAULT_TOKENIZER.read_bytes())
    with pytest.raises(DataConfigError, match="tokenizer_pattern"):
        load_tokenizer(str(target))
    tok = load_tokenizer(str(target), pattern="cl100k")
    assert tok.eos_id == 16382 and tok.bos_id is None
    assert tok.decode(tok.encode("Hello, world")) == "Hello, world"


def test_llama3_style_tokenizer_model(tmp_path):
    target = tmp_path / "tokenizer.model"
    target.write_bytes(DEFAULT_TOKENIZER.read_bytes())
    tok = load_tokenizer(str(target))
    assert tok.bos_id == 16382 and tok.eos_id == 16383  # <|begin_of_text|>, <|end_of_text|> follow ranks
    assert tok.get_vocab_size() == 16382 + 256


def test_bad_tokenizer_inputs(tmp_path, monkeypatch):
    with pytest.raises(DataConfigError, match=r"missing\.tiktoken"):
        load_tokenizer(str(tmp_path / "missing.tiktoken"))
    with pytest.raises(DataConfigError, match="unknown tokenizer 'bogus_base'"):
        load_tokenizer("bogus_base")
    broken = tmp_path / "broken.tiktoken"
    broken.write_text(base64.b64encode(b"a").decode() + " 0\nnot-a-rank-line\n")
    with pytest.raises(DataConfigError, match=r"broken\.tiktoken:2"):
        load_tokenizer(str(broken), pattern="cl100k")

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(DataConfigError, match=r"o200k_base.*cache"):
        load_tokenizer("o200k_base")
