#!/usr/bin/env python
"""Train the shipped byte-level BPE (tiktoken format) on the embedded corpus with ``rustbpe``.

Writes ``NAME.tiktoken`` (``base64-token rank`` lines, loadable by ``tiktoken.Encoding``) and a
``NAME.json`` sidecar with the pre-tokenisation regex and the special tokens, which
``titan_delta.data.tokenizer.load_tokenizer`` reads. The special tokens take the last ids so the total
vocabulary is exactly ``--vocab-size``.

``--measure 8192,16384`` instead trains on 90% of the documents per size and prints held-out bytes/token.

Needs ``pip install rustbpe`` (a tool dependency only; training the 16k vocabulary takes seconds).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import tiktoken

SPECIALS = ("<|endoftext|>", "<|begin_of_text|>")
ASSETS = Path(__file__).resolve().parents[1] / "titan_delta/assets"


def train(texts: list[str], vocab_size: int):
    import rustbpe

    tokenizer = rustbpe.Tokenizer()
    tokenizer.train_from_iterator(iter(texts), vocab_size=vocab_size - len(SPECIALS))
    return tokenizer


def to_encoding(tokenizer, name: str) -> tiktoken.Encoding:
    ranks = {bytes(token): rank for token, rank in tokenizer.get_mergeable_ranks()}
    specials = {tok: len(ranks) + i for i, tok in enumerate(SPECIALS)}
    return tiktoken.Encoding(name, pat_str=tokenizer.get_pattern(), mergeable_ranks=ranks,
                             special_tokens=specials)


def bytes_per_token(encoding: tiktoken.Encoding, texts: list[str]) -> float:
    tokens = sum(len(ids) for ids in encoding.encode_ordinary_batch(texts, num_threads=2))
    return sum(len(t.encode()) for t in texts) / tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ASSETS / "default_corpus.parquet")
    parser.add_argument("--vocab-size", type=int, default=16384, help="total, special tokens included")
    parser.add_argument("--out", type=Path, default=ASSETS / "titan_delta_bpe16k.tiktoken")
    parser.add_argument("--measure", default="", help="comma-separated vocab sizes to compare")
    args = parser.parse_args(argv)
    if not args.corpus.is_file():
        parser.error(f"corpus not found: {args.corpus}")
    texts = pq.read_table(args.corpus, columns=["text"]).column("text").to_pylist()
    if args.measure:
        # Held-out split by a hash of the text, so it is fixed across runs and sizes.
        held = [t for t in texts if hashlib.sha1(t.encode()).digest()[0] < 26]
        fit = [t for t in texts if hashlib.sha1(t.encode()).digest()[0] >= 26]
        for size in (int(s) for s in args.measure.split(",")):
            enc = to_encoding(train(fit, size), f"measure{size}")
            print(f"vocab {size}: held-out {bytes_per_token(enc, held):.3f} bytes/token "
                  f"({len(held)} docs), train {bytes_per_token(enc, fit):.3f}")
        return 0
    encoding = to_encoding(train(texts, args.vocab_size), args.out.stem)
    ranks = sorted(encoding._mergeable_ranks.items(), key=lambda kv: kv[1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(f"{base64.b64encode(tok).decode()} {rank}\n" for tok, rank in ranks))
    sidecar = {
        "pattern": encoding._pat_str,
        "special_tokens": encoding._special_tokens,
        "eos_token": SPECIALS[0],
        "bos_token": SPECIALS[1],
        "trained_on": args.corpus.name,
        "trainer": "tools/train_tokenizer.py (rustbpe)",
    }
    args.out.with_suffix(".json").write_text(json.dumps(sidecar, indent=1) + "\n")
    print(f"wrote {args.out.name}: {encoding.n_vocab} tokens, {bytes_per_token(encoding, texts):.3f} "
          "bytes/token on the training corpus", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
