"""Hugging Face ``tokenizer.json`` as the data tokenizer: a small byte-level BPE trained here (no download)
goes through encoding, EOS/BOS choice, errors, packing, pre-tokenisation, the eval adapter and training."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from tests.data.helpers import IGNORE, make_loader, random_docs, reference_stream, take, write_jsonl
from titan_delta.data import DataConfig, DataConfigError, HFTokenizer, load_tokenizer
from titan_delta.data.pretokenize import pretokenize
from titan_delta.data.sources import DEFAULT_CORPUS
from titan_delta.data.tokenizer import DEFAULT_TOKENIZER

tokenizers = pytest.importorskip("tokenizers", reason="the Hugging Face tokenizers library")

REPO = Path(__file__).resolve().parents[2]
VOCAB = 600
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>"]


def train_bpe(path: Path, lines: list[str], vocab_size: int = VOCAB, specials: list[str] = SPECIALS) -> Path:
    """A byte-level BPE (GPT-2 style: every byte is in the alphabet, so any text round-trips)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def with_specials(src: Path, dst: Path, specials: list[str]) -> Path:
    """``src`` with more special tokens appended (new ids after the vocabulary)."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(src))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    dst.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(dst))
    return dst


@pytest.fixture(scope="module")
def lines() -> list[str]:
    texts = pq.read_table(DEFAULT_CORPUS, columns=["text"]).column("text").to_pylist()
    return [line for text in texts[:80] for line in text.splitlines() if line.strip()][:500]


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory, lines) -> Path:
    return train_bpe(tmp_path_factory.mktemp("hf") / "tokenizer.json", lines)


@pytest.fixture(scope="module")
def hf(tok_path) -> HFTokenizer:
    tok = load_tokenizer(str(tok_path), threads=2)
    assert isinstance(tok, HFTokenizer)
    return tok


def random_text(n: int = 400) -> str:
    codepoints = torch.randint(32, 0x2FFFF, (n,)).tolist()
    return "".join(chr(c) for c in codepoints if not 0xD800 <= c < 0xE000) + " <|endoftext|> \n\t x"


def test_round_trip_ids_and_vocab(hf, tok_path):
    raw = tokenizers.Tokenizer.from_file(str(tok_path))
    assert hf.get_vocab_size() == raw.get_vocab_size(with_added_tokens=True) == VOCAB
    assert (hf.eos_id, hf.bos_id) == (raw.token_to_id("<|endoftext|>"), raw.token_to_id("<|begin_of_text|>"))
    text = random_text()
    ids = hf.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == hf.bos_id and ids[-1] == hf.eos_id
    assert hf.eos_id not in ids[1:-1], "special-token text inside a document must stay text"
    assert max(ids) < hf.get_vocab_size()
    assert hf.decode(ids[1:-1]) == text
    assert hf.encode(text) == ids[1:-1]
    # what was pickled into a loader worker encodes the same (the special-token setting survives)
    assert pickle.loads(pickle.dumps(hf)).encode(text) == ids[1:-1]


def test_batch_encoding_matches_single(hf, tok_path):
    texts = pq.read_table(DEFAULT_CORPUS, columns=["text"]).column("text").to_pylist()
    sample = [texts[i][:5000] for i in torch.randint(0, len(texts), (12,)).tolist()] + ["", random_text(50)]
    single = [hf.encode(t) for t in sample]
    assert [b.tolist() for b in hf.encode_ordinary_batch(sample)] == single
    one_thread = load_tokenizer(str(tok_path), threads=1)
    assert [b.tolist() for b in one_thread.encode_ordinary_batch(sample)] == single
    assert all(b.dtype == np.int64 for b in hf.encode_ordinary_batch(sample))
    assert all(hf.decode(ids) == t for ids, t in zip(single, sample, strict=True))


def test_eos_and_bos_choice(tmp_path, tok_path):
    # only <|endoftext|>: EOS found by name; no BOS, so add_bos has nothing to add
    eos_only = train_bpe(tmp_path / "eos_only.json", ["some text here"] * 20, 300, ["<|endoftext|>"])
    tok = load_tokenizer(str(eos_only))
    assert tok.eos_id == 0 and tok.bos_id is None
    with pytest.raises(DataConfigError, match="no BOS token"):
        tok.encode("x", add_bos=True)
    # several well-known EOS names: ambiguous until data.eos_token picks one
    many = with_specials(tok_path, tmp_path / "many.json", ["<s>", "</s>"])
    with pytest.raises(
        DataConfigError, match=r"several EOS candidates \(<\|endoftext\|>, </s>\).*data\.eos_token"
    ):
        load_tokenizer(str(many))
    with pytest.raises(DataConfigError, match=r"several BOS candidates.*data\.bos_token"):
        load_tokenizer(str(many), eos_token="</s>")
    tok = load_tokenizer(str(many), eos_token="</s>", bos_token="<s>")
    assert (tok.eos_id, tok.bos_id) == (VOCAB + 1, VOCAB)
    assert load_tokenizer(str(many), eos_token="</s>", bos_token="none").bos_id is None
    # a tokenizer_config.json beside tokenizer.json (a Hugging Face model folder) decides
    folder = tmp_path / "model"
    with_specials(tok_path, folder / "tokenizer.json", ["<s>", "</s>"])
    config = {"eos_token": {"content": "</s>", "special": True}, "bos_token": "<s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(str(folder))
    assert (tok.eos_token, tok.bos_token, tok.eos_id, tok.bos_id) == ("</s>", "<s>", VOCAB + 1, VOCAB)
    assert load_tokenizer(str(folder), eos_token="<|endoftext|>").eos_id == 0  # the setting wins
    # no special token at all, or a name that is not in the vocabulary
    bare = train_bpe(tmp_path / "bare.json", ["some text here"] * 20, 300, [])
    with pytest.raises(
        DataConfigError, match=r"no EOS token among its special tokens \(none\).*data\.eos_token"
    ):
        load_tokenizer(str(bare))
    with pytest.raises(DataConfigError, match=r"data\.eos_token = '<nope>' is not in its vocabulary"):
        load_tokenizer(str(tok_path), eos_token="<nope>")
    # tiktoken tokenizers bring their own EOS/BOS
    with pytest.raises(DataConfigError, match="tiktoken tokenizer"):
        load_tokenizer("default", eos_token="<|endoftext|>")


def test_bad_files_are_one_line_errors(tmp_path, tok_path, monkeypatch):
    from titan_delta.trainer.config_checks import ConfigError
    from titan_delta.trainer.path_checks import check_tokenizer

    def error(spec: str, **kw) -> str:
        with pytest.raises(DataConfigError) as info:
            load_tokenizer(spec, **kw)
        with pytest.raises(ConfigError) as checked:
            check_tokenizer(DataConfig(tokenizer=spec))
        for message in (str(info.value), str(checked.value)):
            assert "\n" not in message
        return str(checked.value)

    missing = tmp_path / "missing" / "tokenizer.json"
    assert error(str(missing)) == (
        f"[data] tokenizer: {missing}: file not found (expected a .tiktoken or Llama-3 tokenizer.model ranks "
        "file, or a Hugging Face tokenizer.json or a folder with one)"
    )
    assert f"{tmp_path}: folder without tokenizer.json" in error(str(tmp_path))
    (tmp_path / "broken.json").write_text('{"model": ')
    assert f"{tmp_path}/broken.json: unreadable JSON" in error(str(tmp_path / "broken.json"))
    (tmp_path / "other.json").write_text('{"model": {"type": "Nonsense"}}')
    assert "other.json: not a valid Hugging Face tokenizer.json" in error(str(tmp_path / "other.json"))
    (tmp_path / "list.json").write_text("[1, 2]")
    assert "list.json: not a valid Hugging Face tokenizer.json (no 'model' object)" in error(
        str(tmp_path / "list.json")
    )
    sidecar = DEFAULT_TOKENIZER.with_suffix(".json")
    assert "sidecar of a tiktoken ranks file" in error(str(sidecar))
    check_tokenizer(DataConfig(tokenizer=str(tok_path)))  # a good file passes the up-front check
    check_tokenizer(DataConfig(tokenizer=str(tok_path.parent)))  # so does its folder
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # the library not installed
    assert "needs the 'tokenizers' package" in error(str(tok_path))


def test_packing_through_the_loader(tmp_path, hf):
    docs = ["Ünïcødé <|endoftext|> and <|begin_of_text|> are text here.", *random_docs(30)]
    path = write_jsonl(tmp_path / "docs.jsonl", docs)
    seq_len, batch = 29, 2
    config = DataConfig(sources=[f"jsonl:{path}"], tokenizer=str(hf.source), lanes=1, num_workers=0,
                        document_masking=True, add_bos=True, encode_batch_docs=5)  # fmt: skip
    batches = take(make_loader(config, seq_len, batch, infinite=False), None)  # builds its own tokenizer
    stream, doc_starts = reference_stream(hf, docs, add_bos=True)
    assert len(batches) == (len(stream) - 1) // seq_len // batch > 3
    for k, (inputs, labels) in enumerate(batches):
        base = k * batch * seq_len
        x = inputs["input"].numpy().reshape(-1)
        assert np.array_equal(x, stream[base : base + batch * seq_len])
        expected = stream[base + 1 : base + batch * seq_len + 1].copy()
        expected[[t for t in range(batch * seq_len) if base + t + 1 in doc_starts]] = IGNORE
        assert np.array_equal(labels.numpy().reshape(-1), expected)
    # the documents come back out of the packed stream: BOS text EOS, in order (one lane)
    flat = torch.cat([inputs["input"].reshape(-1) for inputs, _ in batches]).tolist()
    ends = [i for i, t in enumerate(flat) if t == hf.eos_id]
    starts = [0] + [e + 1 for e in ends[:-1]]
    assert all(flat[a] == hf.bos_id for a in starts)
    assert [hf.decode(flat[a + 1 : e]) for a, e in zip(starts, ends, strict=True)] == docs[: len(ends)]
    # two loader workers (forked, one lane each): every row is a row of its lane's reference stream
    workers = DataConfig(**{**config.__dict__, "lanes": 2, "num_workers": 2, "prefetch_factor": 2})
    reference = set()
    for lane in (0, 1):
        lane_stream = reference_stream(hf, docs[lane::2], add_bos=True)[0].tolist()
        reference |= {
            tuple(lane_stream[g * seq_len : (g + 1) * seq_len]) for g in range(len(lane_stream) // seq_len)
        }
    rows = [tuple(row) for inputs, _ in take(make_loader(workers, seq_len, batch, infinite=False), None)
            for row in inputs["input"].tolist()]  # fmt: skip
    assert len(rows) >= 8 and set(rows) <= reference


def test_fingerprint_and_pretokenized_shards(tmp_path, hf, tok_path, lines):
    # the same tokenizer: reloaded, reformatted, through its folder, or with other truncation settings
    copy = tmp_path / "copy" / "tokenizer.json"
    copy.parent.mkdir()
    truncating = tokenizers.Tokenizer.from_file(str(tok_path))
    truncating.enable_truncation(8)
    copy.write_text(json.dumps(json.loads(truncating.to_str()), indent=1))
    same = [load_tokenizer(str(tok_path)), load_tokenizer(str(copy)), load_tokenizer(str(copy.parent))]
    assert {t.fingerprint() for t in same} == {hf.fingerprint()}
    assert len(load_tokenizer(str(copy)).encode(lines[0] * 3)) > 8  # truncation is off
    # another vocabulary, another EOS choice, or the shipped tiktoken BPE
    other = load_tokenizer(str(train_bpe(tmp_path / "other.json", lines, VOCAB - 50)))
    swapped = load_tokenizer(str(tok_path), eos_token="<|begin_of_text|>", bos_token="none")
    prints = [hf.fingerprint(), other.fingerprint(), swapped.fingerprint(), load_tokenizer().fingerprint()]
    assert len(set(prints)) == 4
    # pre-tokenised shards: written with hf, read with hf; another tokenizer is refused by name
    docs = random_docs(40, max_words=20)
    write_jsonl(tmp_path / "docs.jsonl", docs)
    out = tmp_path / "shards"
    pretokenize(DataConfig(sources=[f"jsonl:{tmp_path}/docs.jsonl"], tokenizer=str(tok_path)), hf, out,
                progress=False)  # fmt: skip
    meta = json.loads((out / "index.json").read_text())
    assert (meta["tokenizer"], meta["fingerprint"], meta["dtype"]) == (
        str(tok_path),
        hf.fingerprint(),
        "uint16",
    )
    config = DataConfig(pretokenized=str(out), tokenizer=str(tok_path), num_workers=0)
    (inputs, _), = take(make_loader(config, 16, 2), 1)  # fmt: skip
    expected = [t for d in docs for t in [*hf.encode(d), hf.eos_id]][:32]
    assert inputs["input"].reshape(-1).tolist() == expected
    with pytest.raises(DataConfigError, match="fingerprint"):
        make_loader(DataConfig(pretokenized=str(out), num_workers=0), 16, 2, tokenizer=other)


def test_eval_adapter_scores_with_the_hf_tokenizer(hf):
    pytest.importorskip("lm_eval", reason="lm-eval is the optional 'eval' extra")
    from tests.eval.helpers import Request, tiny_model
    from titan_delta.eval.adapter import TitanDeltaEvalLM

    model = tiny_model(vocab_size=hf.get_vocab_size())
    context, continuation = "In the beginning God created", " the heaven and the earth."
    for add_bos in (False, True):
        lm = TitanDeltaEvalLM(model, hf, batch_size=2, add_bos=add_bos)
        (logprob, _), = lm.loglikelihood([Request(context, continuation)])  # fmt: skip
        prefix = [hf.eos_id] + ([hf.bos_id] if add_bos else [])
        cont = hf.encode(continuation)
        tokens = torch.tensor([prefix + hf.encode(context) + cont])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(tokens[:, :-1]).double(), dim=-1)[0, -len(cont) :]
        expected = float(logprobs.gather(-1, torch.tensor(cont)[:, None]).sum())
        assert logprob == pytest.approx(expected, abs=1e-6)
    ids = hf.encode(" the heaven")
    assert lm._decode([*ids, hf.eos_id, *ids], ["\n"]) == (" the heaven", True)  # generation ends at EOS
    (text,) = lm.generate_until([Request(context, {"until": ["\u2603never"], "max_gen_toks": 3})])
    tokens, greedy = torch.tensor([[*lm.prefix, *hf.encode(context)]]), []
    with torch.no_grad():
        for _ in range(3):
            greedy.append(int(model(tokens)[0, -1].argmax()))
            tokens = torch.cat((tokens, torch.tensor([[greedy[-1]]])), dim=1)
    assert text == hf.decode(greedy[: greedy.index(hf.eos_id)] if hf.eos_id in greedy else greedy)


def test_training_run_takes_its_vocabulary_from_the_hf_tokenizer(tmp_path, tok_path):
    command = [
        sys.executable, "-m", "titan_delta.train", "--job.config_file", "train_configs/debug.toml",
        "--data.tokenizer", str(tok_path), "--training.steps", "2", "--training.seq_len", "64",
        "--lr_scheduler.warmup_steps", "1", "--eval.no-enable", "--checkpoint.no-enable",
        "--metrics.log_freq", "1", "--metrics.disable_color_printing", "--data.num_workers", "2",
        "--job.dump_folder", str(tmp_path / "run"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert f'"vocab_size": {VOCAB}' in proc.stdout  # the model was built with the tokenizer's vocabulary
    assert "step:  2  loss:" in proc.stdout
