"""Data tokenizers behind torchtitan's ``BaseTokenizer``: tiktoken (named encodings, ranks files, the shipped
BPE) and Hugging Face ``tokenizer.json`` files (:mod:`titan_delta.data.hf_tokenizer`), one interface.

Documents are encoded as ordinary text (a literal ``<|endoftext|>`` inside a document is text, never the
special token), then ``[BOS] + tokens + [EOS]`` is added explicitly by the packer, so special-token
handling never depends on what a document happens to contain.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken

from titan_delta.data.config import DataConfigError, data_config_from
from titan_delta.data.hf_tokenizer import is_hf_tokenizer_spec, load_hf_tokenizer
from titan_delta.data.tokenizer_base import DataTokenizer

ASSETS = Path(__file__).resolve().parents[1] / "assets"
DEFAULT_TOKENIZER = ASSETS / "titan_delta_bpe16k.tiktoken"
NAMED_ENCODINGS = ("o200k_base", "cl100k_base", "r50k_base", "p50k_base", "gpt2")
# Pre-tokenisation regexes for ranks files that come without a sidecar (published patterns).
PATTERNS = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "cl100k": r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"
    r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s",
    "r50k": r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s",
}
ENDOFTEXT = "<|endoftext|>"


def _llama3_specials(num_ranks: int) -> dict[str, int]:
    """Llama-3's 256 special tokens follow the ranks; BOS/EOS are the first two."""
    named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
             "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    names = named + [f"<|reserved_special_token_{i}|>" for i in range(2, 2 + 256 - len(named))]
    return {name: num_ranks + i for i, name in enumerate(names)}


def read_ranks(path: Path) -> dict[bytes, int]:
    """Read a tiktoken ranks file (``base64-token rank`` per line) with a clear error on bad content."""
    if not path.is_file():
        raise DataConfigError(f"tokenizer file not found: {path}")
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as err:
            message = f"{path}:{lineno}: expected 'base64-token rank', got {line[:60]!r}"
            raise DataConfigError(message) from err
    if not ranks:
        raise DataConfigError(f"tokenizer file {path} holds no ranks")
    return ranks


class TiktokenTokenizer(DataTokenizer):
    """A tiktoken ``Encoding`` with explicit BOS/EOS ids and threaded batch encoding."""

    def __init__(self, encoding: tiktoken.Encoding, eos_token: str, bos_token: str | None,
                 threads: int = 2, source: str = "") -> None:
        super().__init__()
        self.encoding = encoding
        self.source = source or encoding.name
        specials = encoding._special_tokens
        if eos_token not in specials:
            raise DataConfigError(f"tokenizer {self.source}: EOS token {eos_token!r} is not a special token")
        if bos_token is not None and bos_token not in specials:
            raise DataConfigError(f"tokenizer {self.source}: BOS token {bos_token!r} is not a special token")
        self.eos_token, self.bos_token = eos_token, bos_token
        self.eos_id: int = specials[eos_token]
        self.bos_id: int | None = specials[bos_token] if bos_token else None
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def __getstate__(self) -> dict[str, Any]:  # the thread pool cannot cross into loader workers
        return {**self.__dict__, "_pool": None}

    def encode_ordinary(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: Any, **_: Any) -> str:
        return self.encoding.decode([int(i) for i in ids])

    def get_vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode_ordinary_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Encode many texts on a persistent thread pool (tiktoken releases the GIL while encoding)."""
        if self.threads <= 1 or len(texts) <= 1:
            return [np.asarray(self.encoding.encode_ordinary(t), dtype=np.int64) for t in texts]
        if self._pool is None or self._pool_pid != os.getpid():
            # A pool inherited through fork (loader workers) has no threads behind it: make a new one.
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tiktoken")
            self._pool_pid = os.getpid()
        out = self._pool.map(self.encoding.encode_ordinary, texts)
        return [np.asarray(ids, dtype=np.int64) for ids in out]

    def fingerprint(self) -> str:
        """Identifies the exact vocabulary, so pre-tokenised shards are never read with another one."""
        h = hashlib.sha256(self.encoding._pat_str.encode())
        for token, rank in sorted(self.encoding._mergeable_ranks.items(), key=lambda kv: kv[1]):
            h.update(token + rank.to_bytes(4, "little"))
        h.update(json.dumps(sorted(self.encoding._special_tokens.items())).encode())
        return h.hexdigest()[:16]


def load_tokenizer(
    spec: str = "default", pattern: str = "", threads: int = 2, eos_token: str = "", bos_token: str = ""
) -> DataTokenizer:
    """``default``, a named tiktoken encoding, a ranks file (pattern/specials from its .json sidecar), or a
    Hugging Face ``tokenizer.json`` (or a folder holding one). ``eos_token``/``bos_token`` choose the EOS and
    BOS of a Hugging Face tokenizer (a tiktoken tokenizer's come with it)."""
    named = spec == "default" or spec in NAMED_ENCODINGS  # never a folder of that name in the working dir
    if not named and is_hf_tokenizer_spec(spec):
        return load_hf_tokenizer(spec, threads, eos_token, bos_token)
    if eos_token or bos_token:
        raise DataConfigError(
            f"data.eos_token / data.bos_token choose the special tokens of a Hugging Face tokenizer.json; "
            f"tokenizer {spec!r} is a tiktoken tokenizer, whose EOS/BOS come with it (sidecar or fixed names)"
        )
    if spec == "default":
        return _from_ranks_file(DEFAULT_TOKENIZER, pattern, threads)
    if spec in NAMED_ENCODINGS:
        try:
            encoding = tiktoken.get_encoding(spec)
        except Exception as err:
            raise DataConfigError(
                f"tiktoken encoding {spec!r} could not be loaded: it needs tiktoken's cache "
                f"(TIKTOKEN_CACHE_DIR) or network access ({type(err).__name__}: {err})"
            ) from err
        return TiktokenTokenizer(encoding, ENDOFTEXT, None, threads, source=spec)
    path = Path(spec).expanduser()
    if path.suffix in (".tiktoken", ".model") or path.exists():
        return _from_ranks_file(path, pattern, threads)
    raise DataConfigError(
        f"unknown tokenizer {spec!r}: expected 'default', one of {', '.join(NAMED_ENCODINGS)}, "
        "the path of a .tiktoken / tokenizer.model ranks file, or a Hugging Face tokenizer.json "
        "(or a folder holding one)"
    )


def _from_ranks_file(path: Path, pattern: str, threads: int) -> TiktokenTokenizer:
    ranks = read_ranks(path)
    sidecar = path.with_suffix(".json")
    if sidecar.is_file():
        meta = json.loads(sidecar.read_text())
        pat_str, specials = meta["pattern"], {k: int(v) for k, v in meta["special_tokens"].items()}
        eos, bos = meta["eos_token"], meta.get("bos_token")
    elif path.name == "tokenizer.model" or pattern == "llama3":
        pat_str, specials = PATTERNS["llama3"], _llama3_specials(len(ranks))
        eos, bos = "<|end_of_text|>", "<|begin_of_text|>"
    elif pattern:
        pat_str = PATTERNS.get(pattern, pattern)
        specials, eos, bos = {ENDOFTEXT: len(ranks)}, ENDOFTEXT, None
    else:
        raise DataConfigError(
            f"tokenizer {path}: no sidecar {sidecar.name} and no data.tokenizer_pattern; set it to one of "
            f"{', '.join(PATTERNS)} or to the regex the ranks were trained with"
        )
    try:
        encoding = tiktoken.Encoding(
            path.stem, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=specials
        )
    except Exception as err:
        raise DataConfigError(f"tokenizer {path}: tiktoken rejected it ({err})") from err
    return TiktokenTokenizer(encoding, eos, bos, threads, source=str(path.name))


def build_tokenizer(job_config: Any) -> DataTokenizer:
    """torchtitan ``build_tokenizer_fn``: reads ``job_config.data`` (defaults when absent)."""
    c = data_config_from(job_config)
    return load_tokenizer(c.tokenizer, c.tokenizer_pattern, c.tokenize_threads, c.eos_token, c.bos_token)
