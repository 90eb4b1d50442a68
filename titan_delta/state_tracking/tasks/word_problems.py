"""Word problems of permutation groups (DeltaProduct paper): output the running product of the prefix.

Each input token is a group element; the target after token t is the product of tokens 1..t, itself an
element of the group. Convention: elements are permutations of {0..n-1} as tuples p (i ↦ p[i]), and
applying g_t after the prefix gives P_t = g_t ∘ P_{t-1}, i.e. P_t[i] = g_t[P_{t-1}[i]], P_0 = identity.
Groups: S3, S4, S5 (all permutations) and A5 (the even ones, the smallest non-solvable group).
Element ids index the permutations in lexicographic order. ``length`` = number of elements in the word.
"""

from __future__ import annotations

import itertools

import numpy as np

from titan_delta.state_tracking.tasks.base import StateTrackingTask

GROUPS = ("S3", "S4", "A5", "S5")


def permutation_parity(perm: tuple[int, ...]) -> int:
    """0 for even, 1 for odd (counted by inversions)."""
    return sum(a > b for a, b in itertools.combinations(perm, 2)) % 2


def group_elements(group: str) -> list[tuple[int, ...]]:
    """The group's permutations in lexicographic order (ids are indices into this list)."""
    if group not in GROUPS:
        raise ValueError(f"task word_problem: group must be one of {GROUPS}, got {group!r}")
    degree = int(group[1])
    perms = list(itertools.permutations(range(degree)))
    if group.startswith("A"):
        perms = [p for p in perms if permutation_parity(p) == 0]
    return perms


def compose(after: tuple[int, ...], before: tuple[int, ...]) -> tuple[int, ...]:
    """(after ∘ before)[i] = after[before[i]]: apply ``before`` first."""
    return tuple(after[i] for i in before)


def multiplication_table(elements: list[tuple[int, ...]]) -> np.ndarray:
    """table[g, p] = id of g ∘ p."""
    index = {perm: i for i, perm in enumerate(elements)}
    table = np.empty((len(elements), len(elements)), dtype=np.int64)
    for g, after in enumerate(elements):
        for p, before in enumerate(elements):
            table[g, p] = index[compose(after, before)]
    return table


class WordProblemTask(StateTrackingTask):
    name = "word_problem"
    length_unit = "elements"

    def __init__(self, group: str = "S3") -> None:
        self.group = group
        self.elements = group_elements(group)
        self.identity = self.elements.index(tuple(range(len(self.elements[0]))))
        self.table = multiplication_table(self.elements)

    @property
    def vocab_size(self) -> int:
        return len(self.elements)

    def tokens_per_sequence(self, length: int) -> int:
        return length

    def generate(
        self, length: int, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        word = rng.integers(0, len(self.elements), size=(batch_size, length))
        targets = np.empty_like(word)
        product = np.full(batch_size, self.identity, dtype=np.int64)
        for t in range(length):
            product = self.table[word[:, t], product]
            targets[:, t] = product
        return word, targets
