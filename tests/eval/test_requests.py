"""Request preparation rules: the context/continuation boundary, left truncation, rolling windows."""

from __future__ import annotations

import pytest

from titan_delta.eval.requests import (
    batches_by_length,
    batches_of_equal_length,
    cut_at_stop,
    document_prefix,
    generation_prompt,
    loglikelihood_row,
    rolling_rows,
    split_trailing_space,
)


class CharTokenizer:
    """One token per character (ids = code points), EOS 0, BOS 1: boundaries are easy to read."""

    eos_id, bos_id = 0, 1

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


TOK = CharTokenizer()


def test_prefix_follows_training_documents() -> None:
    assert document_prefix(TOK, add_bos=False) == [0]
    assert document_prefix(TOK, add_bos=True) == [0, 1]


def test_trailing_space_moves_to_the_continuation() -> None:
    assert split_trailing_space("Answer: ", "yes") == ("Answer:", " yes")
    assert split_trailing_space("Answer:", " yes") == ("Answer:", " yes")


def test_loglikelihood_row_boundary_and_truncation() -> None:
    row = loglikelihood_row(3, "ab ", "cd", TOK, [0], max_length=64)
    assert row.request == 3
    assert row.inputs == (0, ord("a"), ord("b"), ord(" "), ord("c"))
    assert row.targets == (ord(" "), ord("c"), ord("d"))
    short = loglikelihood_row(0, "abcdefgh", "XY", TOK, [0], max_length=4)
    assert short.inputs == tuple(map(ord, "fghX")) and short.targets == tuple(map(ord, "XY"))
    with pytest.raises(ValueError, match="encodes to no tokens"):
        loglikelihood_row(0, "abc", "", TOK, [0], max_length=8)


def test_rolling_windows_score_every_token_once_with_full_history() -> None:
    text = "abcdefghijklm"  # 13 tokens after the 1-token prefix
    rows = rolling_rows(0, text, TOK, [0], max_length=5)
    scored = [t for row in rows for t in row.targets]
    assert scored == [ord(c) for c in text]
    stream = [0, *map(ord, text)]
    for row in rows:
        assert len(row.inputs) <= 5 and len(row.targets) <= len(row.inputs)
        end = stream.index(row.targets[-1])  # characters are unique
        assert row.inputs == tuple(stream[max(0, end - 5) : end])  # the 5 tokens before the last target


def test_generation_prompt_leaves_room_for_the_answer() -> None:
    assert generation_prompt("abcdef", TOK, [0], max_length=6, max_new_tokens=2) == list(map(ord, "cdef"))
    with pytest.raises(ValueError, match="max_gen_toks=6"):
        generation_prompt("abc", TOK, [0], max_length=6, max_new_tokens=6)


def test_batching() -> None:
    assert batches_by_length([3, 9, 1, 9, 5], 2) == [[1, 3], [4, 0], [2]]
    keys = [(4, "x"), (2, "x"), (4, "x"), (4, "y"), (4, "x")]
    assert batches_of_equal_length(keys, 2) == [[0, 2], [4], [3], [1]]
    with pytest.raises(ValueError, match="batch_size"):
        batches_by_length([1], 0)


def test_cut_at_stop_uses_the_earliest_stop() -> None:
    assert cut_at_stop("one. two\nthree", ["\n", "."]) == ("one", True)
    assert cut_at_stop("no stop here", ["\n"]) == ("no stop here", False)
    assert cut_at_stop("keep", [""]) == ("keep", False)
