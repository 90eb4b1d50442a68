"""The training tokenizer as Hugging Face files: ``tokenizer.json``, ``tokenizer_config.json`` and
``special_tokens_map.json``, loadable by ``AutoTokenizer.from_pretrained`` with no custom code.

A Hugging Face tokenizer (``[data] tokenizer`` = a tokenizer.json) is written back as it is, with the
post-processor below. A tiktoken tokenizer is converted; its JSON is written by hand (the ``tokenizers``
library is not needed to export), in the layout the ``tokenizers`` library and transformers' own tiktoken
converter produce:

- model: byte-level BPE whose vocabulary is the tiktoken ranks (bytes mapped to printable characters
  with GPT-2's byte-to-unicode table) and whose merges are every split of a token into two lower-ranked
  tokens, ordered by the rank of the merged token. Merging the pair whose result has the lowest rank is
  exactly tiktoken's rule, and ``ignore_merges`` makes a piece that is itself a token map to it directly,
  as tiktoken does before merging anything.
- pre-tokenizer: the tiktoken regex (Isolated split), then the byte-level mapping without its own regex.
- special tokens: added tokens with their tiktoken ids. ``split_special_tokens`` is on, because training
  encoded documents with ``encode_ordinary``: a literal ``<|endoftext|>`` inside a text is text.
- post-processor: with ``add_special_tokens=True`` (the default) every encoding starts with the tokens
  that preceded every document in training: EOS, then BOS when the data pipeline added one. That is
  what ``titan_delta.eval`` feeds the model before every context, and what a user calling
  ``tokenizer(text)`` should get.
"""

from __future__ import annotations

import json
import os
from typing import Any

from titan_delta.data.tokenizer import DataTokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[str]]:
    """The BPE vocabulary and merge list equivalent to tiktoken's ranks (see the module docstring)."""
    table = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return vocab, [f"{text(left)} {text(right)}" for _, _, _, left, right in merges]


def special_ids(tokenizer: DataTokenizer) -> dict[str, int]:
    """Special token → id, for a tiktoken (``encoding``) or Hugging Face (``tokenizer``) data tokenizer."""
    encoding = getattr(tokenizer, "encoding", None)
    if encoding is not None:
        return dict(sorted(encoding._special_tokens.items(), key=lambda kv: kv[1]))
    added = tokenizer.tokenizer.get_added_tokens_decoder()  # type: ignore[attr-defined]
    return {token.content: i for i, token in sorted(added.items()) if token.special}


def document_prefix_tokens(tokenizer: DataTokenizer, add_bos: bool) -> list[str]:
    """Special tokens before every document in training: EOS, then BOS with ``[data] add_bos``."""
    if add_bos and tokenizer.bos_token is None:
        raise ValueError(f"add_bos is set but tokenizer {tokenizer.source} has no BOS token")
    return [tokenizer.eos_token] + ([tokenizer.bos_token] if add_bos and tokenizer.bos_token else [])


def _template(prefix: list[str], ids: dict[str, int]) -> dict[str, Any]:
    def special(name: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": name, "type_id": type_id}}

    def sequence(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    single = [special(p, 0) for p in prefix] + [sequence("A", 0)]
    pair = single + [special(p, 1) for p in prefix] + [sequence("B", 1)]
    specials = {p: {"id": p, "ids": [ids[p]], "tokens": [p]} for p in prefix}
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def tokenizer_json(tokenizer: DataTokenizer, add_bos: bool) -> dict[str, Any]:
    """The ``tokenizers`` library's serialisation of ``tokenizer`` (format version 1.0), its post-processor
    adding the document prefix."""
    prefix = document_prefix_tokens(tokenizer, add_bos)
    encoding = getattr(tokenizer, "encoding", None)
    if encoding is None:  # already a Hugging Face tokenizer: keep it, drop stored truncation/padding
        raw = json.loads(tokenizer.tokenizer.to_str())  # type: ignore[attr-defined]
        ids = {name: tokenizer.tokenizer.token_to_id(name) for name in prefix}  # type: ignore[attr-defined]
        return {**raw, "truncation": None, "padding": None, "post_processor": _template(prefix, ids)}
    vocab, merges = vocab_and_merges(encoding._mergeable_ranks)
    specials = dict(sorted(encoding._special_tokens.items(), key=lambda kv: kv[1]))
    added = [
        {"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for name, i in specials.items()
    ]  # fmt: skip
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": encoding._pat_str},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", **byte_level},
            ],
        },
        "post_processor": _template(prefix, specials),
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }


def special_tokens_map(tokenizer: DataTokenizer, add_bos: bool) -> dict[str, str]:
    """bos_token is the last token of the document prefix, so lm-eval's ``prefix_token_id`` (which
    conditions empty contexts and perplexity windows) is what training put before documents."""
    prefix = document_prefix_tokens(tokenizer, add_bos)
    return {"bos_token": prefix[-1], "eos_token": tokenizer.eos_token, "pad_token": tokenizer.eos_token}


def write_tokenizer_files(folder: str, tokenizer: DataTokenizer, add_bos: bool, max_length: int) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into ``folder``."""
    specials = special_tokens_map(tokenizer, add_bos)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "model_max_length": max_length,
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {
                "content": name,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for name, i in special_ids(tokenizer).items()
        },
        "titan_delta_tokenizer": tokenizer.source,
        "titan_delta_fingerprint": tokenizer.fingerprint(),
    }
    files = {
        "tokenizer.json": tokenizer_json(tokenizer, add_bos),
        "tokenizer_config.json": config,
        "special_tokens_map.json": specials,
    }
    for name, payload in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(payload, f, ensure_ascii=False, indent=None if name == "tokenizer.json" else 2)
