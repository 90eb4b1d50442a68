"""Turning lm-eval requests into scoring rows: token boundaries, left truncation, rolling windows, batches.

Pure functions over token ids (no model, no lm-eval import), so every rule here is unit-testable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Tokenizer(Protocol):
    eos_id: int
    bos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class ScoringRow:
    """One forward row: ``inputs`` predict ``targets``, which are the last len(targets) tokens the
    inputs are followed by (targets[j] is predicted at input position len(inputs) − len(targets) + j)."""

    request: int  # index of the request the row belongs to
    inputs: tuple[int, ...]
    targets: tuple[int, ...]


def document_prefix(tokenizer: Tokenizer, add_bos: bool) -> list[int]:
    """Tokens that precede every document in training's packed stream: the previous document's EOS, then
    BOS when the data pipeline adds one. Every eval context starts with them."""
    if add_bos and tokenizer.bos_id is None:
        raise ValueError("add_bos=True but the tokenizer has no BOS token")
    return [tokenizer.eos_id] + ([tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else [])


def split_trailing_space(context: str, continuation: str) -> tuple[str, str]:
    """Move whitespace that ends the context onto the continuation, so a BPE that attaches spaces to the
    following word encodes " word" as one token rather than a lone space at the context's end."""
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def loglikelihood_row(
    request: int, context: str, continuation: str, tokenizer: Tokenizer, prefix: list[int], max_length: int
) -> ScoringRow:
    """Context and continuation are encoded separately, so the boundary between them is exact; the
    sequence is truncated from the left to ``max_length`` inputs (continuation tokens are kept first)."""
    context, continuation = split_trailing_space(context, continuation)
    cont_ids = tokenizer.encode(continuation)
    if not cont_ids:
        raise ValueError(f"request {request}: the continuation {continuation!r} encodes to no tokens")
    whole = prefix + tokenizer.encode(context) + cont_ids
    whole = whole[-(max_length + 1) :]
    n_targets = min(len(cont_ids), len(whole) - 1)
    return ScoringRow(request, tuple(whole[:-1]), tuple(whole[len(whole) - n_targets :]))


def rolling_rows(
    request: int, text: str, tokenizer: Tokenizer, prefix: list[int], max_length: int
) -> list[ScoringRow]:
    """Every token of ``text`` scored exactly once, in windows of ≤ max_length targets; each window sees
    the longest history that fits (the ``max_length`` tokens before its last target)."""
    stream = prefix + tokenizer.encode(text)
    rows = []
    for start in range(len(prefix), len(stream), max_length):  # first target of each window
        end = min(start + max_length, len(stream))  # one past its last target
        first_input = max(0, end - 1 - max_length)
        rows.append(ScoringRow(request, tuple(stream[first_input : end - 1]), tuple(stream[start:end])))
    return rows


def generation_prompt(
    context: str, tokenizer: Tokenizer, prefix: list[int], max_length: int, max_new_tokens: int
) -> list[int]:
    """The prompt's tokens, left-truncated so prompt + generation fit in ``max_length``."""
    if max_new_tokens >= max_length:
        raise ValueError(
            f"max_gen_toks={max_new_tokens} leaves no room for a prompt in max_length={max_length}"
        )
    ids = prefix + tokenizer.encode(context)
    return ids[-(max_length - max_new_tokens) :]


def batches_by_length(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length, longest first (an out-of-memory shows up at once;
    padding within a batch stays small)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def batches_of_equal_length(keys: list[tuple], batch_size: int) -> list[list[int]]:
    """Indices grouped by identical key (prompt length and generation settings), ≤ batch_size each: rows of
    a decoding batch must advance in lock-step through one cache, with no padding."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    ordered = sorted(groups.values(), key=lambda idx: (-keys[idx[0]][0], idx[0]))
    return [group[i : i + batch_size] for group in ordered for i in range(0, len(group), batch_size)]


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop sequence, and whether one occurred."""
    cut = min((pos for pos in (text.find(s) for s in stops if s) if pos >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)
