"""Hugging Face ``tokenizers`` (a ``tokenizer.json``) behind the same interface as the tiktoken tokenizers.

``[data] tokenizer`` selects it by path: any ``*.json`` file, or a folder holding ``tokenizer.json`` (a
Hugging Face model folder). The ``tokenizers`` library is imported only then.

As with tiktoken, documents are encoded as ordinary text: the tokenizer's special tokens are not matched
inside a document (``encode_special_tokens``), its post-processor (template BOS/EOS) is not applied, and
truncation and padding stored in the file are switched off; the packer adds ``[BOS] + tokens + [EOS]``.

EOS and BOS, in order of precedence: ``[data] eos_token`` / ``bos_token`` (``bos_token = "none"``: no BOS);
``eos_token`` / ``bos_token`` of a ``tokenizer_config.json`` beside the file; the one well-known name among
the special tokens (``EOS_NAMES``, ``BOS_NAMES``). No EOS, or several candidates, is an error naming the
special tokens and the setting to choose with; no BOS candidate means no BOS.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from titan_delta.data.config import DataConfigError
from titan_delta.data.tokenizer_base import DataTokenizer

logger = logging.getLogger(__name__)

HF_TOKENIZER_FILE = "tokenizer.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
EXPECTED = "a Hugging Face tokenizer.json or a folder holding one"
# Well-known special-token names, used only when neither the config nor tokenizer_config.json names one.
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|bos|>", "[BOS]")
NO_BOS = "none"
# Keys of tokenizer.json that do not change how text becomes ids here (both are switched off at load).
_UNUSED_KEYS = ("truncation", "padding")


def is_hf_tokenizer_spec(spec: str) -> bool:
    """A ``*.json`` path or a folder: the Hugging Face kind of ``[data] tokenizer``."""
    path = Path(spec).expanduser()
    return path.suffix.lower() == ".json" or path.is_dir()


def _import_tokenizers(where: str) -> Any:
    try:
        import tokenizers
    except ImportError as err:
        raise DataConfigError(
            f"tokenizer {where}: a Hugging Face tokenizer.json needs the 'tokenizers' package "
            f"(pip install tokenizers; {err})"
        ) from err
    return tokenizers


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _listing(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit]) or "none"
    return f"{shown}, +{len(names) - limit} more" if len(names) > limit else shown


class HFTokenizer(DataTokenizer):
    """A ``tokenizers.Tokenizer`` with explicit BOS/EOS ids, read from ``file``.

    ``raw``: the file's parsed JSON (only for the fingerprint); ``eos_token``/``bos_token``: the chosen
    names (``bos_token`` None = no BOS)."""

    def __init__(self, tokenizer: Any, raw: dict[str, Any], eos_token: str, bos_token: str | None,
                 threads: int = 2, source: str = "") -> None:  # fmt: skip
        super().__init__()
        self.tokenizer = tokenizer
        self.source = source
        self.eos_token, self.bos_token = eos_token, bos_token
        self.eos_id: int = tokenizer.token_to_id(eos_token)
        self.bos_id: int | None = tokenizer.token_to_id(bos_token) if bos_token is not None else None
        self.threads = threads
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
        self._fingerprint = self._hash(raw)
        if threads > 1:
            # The library encodes batches on its own (Rust) thread pool, sized once per process.
            os.environ.setdefault("RAYON_NUM_THREADS", str(threads))

    def _hash(self, raw: dict[str, Any]) -> str:
        content = {k: v for k, v in raw.items() if k not in _UNUSED_KEYS}
        h = hashlib.sha256(b"hf-tokenizers\0")
        h.update(json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
        h.update(json.dumps({"eos": self.eos_id, "bos": self.bos_id}).encode())
        return h.hexdigest()[:16]

    def __setstate__(self, state: dict[str, Any]) -> None:  # a pickled Tokenizer forgets this setting
        self.__dict__.update(state)
        self.tokenizer.encode_special_tokens = True

    def encode_ordinary(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Any, **_: Any) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def get_vocab_size(self) -> int:
        return self.vocab_size

    def encode_ordinary_batch(self, texts: list[str]) -> list[np.ndarray]:
        """One call into the library, which encodes on its own thread pool (the GIL is released)."""
        if self.threads <= 1 or len(texts) <= 1:
            return [np.asarray(self.encode_ordinary(t), dtype=np.int64) for t in texts]
        encode_batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [np.asarray(e.ids, dtype=np.int64) for e in encode_batch(texts, add_special_tokens=False)]

    def fingerprint(self) -> str:
        """Over the file's JSON (formatting, truncation and padding aside) and the EOS/BOS ids."""
        return self._fingerprint


def _read_json(path: Path, what: str) -> tuple[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        return text, json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DataConfigError(f"tokenizer {path}: unreadable {what} ({_first_line(err)})") from err


def _config_token(config: dict[str, Any], key: str) -> str | None:
    """``eos_token``/``bos_token`` of tokenizer_config.json: a string or ``{"content": ...}``."""
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _choose(kind: str, explicit: str, configured: str | None, names: tuple[str, ...], specials: list[str],
            tokenizer: Any, where: str) -> str | None:  # fmt: skip
    setting = f"data.{kind.lower()}_token"
    if explicit:
        if kind == "BOS" and explicit.lower() == NO_BOS:
            return None
        if tokenizer.token_to_id(explicit) is None:
            raise DataConfigError(
                f"tokenizer {where}: {setting} = {explicit!r} is not in its vocabulary "
                f"(special tokens: {_listing(specials)})"
            )
        if explicit not in specials:
            logger.warning(
                f"tokenizer {where}: {setting} = {explicit!r} is not a special token, so document "
                "text can produce it too"
            )
        return explicit
    if configured is not None:
        if tokenizer.token_to_id(configured) is None:
            raise DataConfigError(
                f"tokenizer {where}: {HF_TOKENIZER_CONFIG} names {kind} {configured!r}, which is not in its "
                f"vocabulary; set {setting} (special tokens: {_listing(specials)})"
            )
        return configured
    found = [name for name in names if name in specials]
    if len(found) == 1:
        return found[0]
    if not found and kind == "BOS":
        return None
    what = f"several {kind} candidates ({', '.join(found)})" if found else f"no {kind} token"
    choose = "to one of them" if found else "to the token that ends every document"
    extra = ' (or "none")' if kind == "BOS" else ""
    raise DataConfigError(
        f"tokenizer {where}: {what} among its special tokens ({_listing(specials)}): set {setting} "
        f"{choose}{extra}"
    )


def load_hf_tokenizer(spec: str, threads: int = 2, eos_token: str = "", bos_token: str = "") -> HFTokenizer:
    """A ``tokenizer.json`` file (or a folder holding one); EOS/BOS chosen as the module docstring says."""
    path = Path(spec).expanduser()
    file = path / HF_TOKENIZER_FILE if path.is_dir() else path
    if path.is_dir() and not file.is_file():
        raise DataConfigError(f"tokenizer folder {path} holds no {HF_TOKENIZER_FILE} (expected {EXPECTED})")
    if not file.is_file():
        raise DataConfigError(f"tokenizer file not found: {file} (expected {EXPECTED})")
    text, raw = _read_json(file, "JSON")
    if isinstance(raw, dict) and {"pattern", "special_tokens"} <= raw.keys():
        raise DataConfigError(
            f"tokenizer {file}: this is the sidecar of a tiktoken ranks file, not a Hugging Face "
            f"tokenizer.json: set data.tokenizer to the .tiktoken file beside it"
        )
    tokenizers = _import_tokenizers(str(file))
    try:
        if not isinstance(raw, dict) or "model" not in raw:
            raise ValueError("no 'model' object")
        tok = tokenizers.Tokenizer.from_str(text)
    except Exception as err:
        raise DataConfigError(
            f"tokenizer {file}: not a valid Hugging Face tokenizer.json ({_first_line(err)})"
        ) from err
    try:
        tok.encode_special_tokens = True
    except AttributeError as err:
        message = "this tokenizers version has no encode_special_tokens (pip install -U tokenizers)"
        raise DataConfigError(f"tokenizer {file}: {message}") from err
    tok.no_truncation()
    tok.no_padding()
    specials = [t.content for _, t in sorted(tok.get_added_tokens_decoder().items()) if t.special]
    config_file = file.parent / HF_TOKENIZER_CONFIG
    config = _read_json(config_file, HF_TOKENIZER_CONFIG)[1] if config_file.is_file() else {}
    config = config if isinstance(config, dict) else {}
    eos = _choose("EOS", eos_token, _config_token(config, "eos_token"), EOS_NAMES, specials, tok, str(file))
    bos = _choose("BOS", bos_token, _config_token(config, "bos_token"), BOS_NAMES, specials, tok, str(file))
    assert eos is not None
    return HFTokenizer(tok, raw, eos, bos, threads, source=str(file))
