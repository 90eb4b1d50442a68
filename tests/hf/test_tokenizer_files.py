"""The exported tokenizer.json encodes exactly as our tiktoken tokenizer and loads with AutoTokenizer."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from titan_delta.data.tokenizer import ASSETS, load_tokenizer
from titan_delta.hf.tokenizer_files import write_tokenizer_files

EDGE_CASES = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\r\n",
    " \r\n \t",
    "\t\tx",
    "a  b   c    ",
    "trailing   ",
    "   leading",
    "\u00a0nbsp\u00a0 x",
    "\u3000ideographic\u3000space",
    "\u2028line\u2029para",
    "\u200bzero\u200dwidth\ufeff",
    "café naïve Ünïcödé",
    "日本語のテキスト、そして中文。",
    "emoji 👩‍👩‍👧‍👦 🇩🇪 ✔️",
    "e\u0301 combining",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "<|endoftext|> literal <|begin_of_text|>",
    "it's I'M they'LL we've 'd",
    "12345678901 3.14159",
    "x=1;y=2\n\tif x:\n\t\treturn",
    "Привет, мир! Ελληνικά",
    "عربى עברית",
    "\x00\x01\x7f ctrl",
    "a\u0085b",
    "ﬁ ligature ½",
    "!!!???...",
    "hello\n \n  \nworld",
    "\U0010ffff end",
]


def _corpus_sample(max_chars: int = 600_000) -> list[str]:
    """Whole documents of the embedded corpus (Bible and Python docs) up to ``max_chars`` characters."""
    texts = pq.read_table(ASSETS / "default_corpus.parquet", columns=["text"]).column("text").to_pylist()
    texts = texts[::7]  # both sources, spread over the file
    sample, total = [], 0
    for text in texts:
        if total > max_chars:
            break
        sample.append(text)
        total += len(text)
    return sample


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tokenizer")
    ours = load_tokenizer()
    write_tokenizer_files(str(folder), ours, add_bos=False, max_length=256)
    return ours, AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def test_identical_ids_on_corpus_and_edge_cases(converted) -> None:
    ours, hf = converted
    texts = _corpus_sample() + EDGE_CASES
    theirs = hf(texts, add_special_tokens=False)["input_ids"]
    for text, ids in zip(texts, theirs, strict=True):
        assert ids == ours.encode(text), f"encodings differ for {text[:80]!r}"
        assert hf.decode(ids) == ours.decode(ids)


def test_special_tokens_and_document_prefix(converted) -> None:
    ours, hf = converted
    assert (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) == (ours.eos_id, ours.eos_id, ours.eos_id)
    assert len(hf) == ours.get_vocab_size()
    # the default encoding starts like every training document: after an EOS
    assert hf("In the beginning")["input_ids"] == [ours.eos_id, *ours.encode("In the beginning")]
    # special-token text inside a document is text, as training's encode_ordinary treats it
    assert hf("<|endoftext|>", add_special_tokens=False)["input_ids"] == ours.encode("<|endoftext|>")


def test_bos_runs_prefix_eos_then_bos(tmp_path) -> None:
    ours = load_tokenizer()
    write_tokenizer_files(str(tmp_path), ours, add_bos=True, max_length=256)
    hf = AutoTokenizer.from_pretrained(str(tmp_path), trust_remote_code=False)
    assert hf("x")["input_ids"] == [ours.eos_id, ours.bos_id, *ours.encode("x")]
    assert hf.bos_token_id == ours.bos_id
