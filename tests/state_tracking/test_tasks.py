"""Every generator's labels against a plain-Python simulation of the same problem."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from titan_delta.state_tracking.tasks import GROUPS, IGNORE_INDEX, TASKS, build_task
from titan_delta.state_tracking.tasks.word_problems import group_elements


def sample(name: str, options: dict, length: int, batch: int = 16, seed: int = 0):
    task = build_task(name, options)
    b = task.sample(length, batch, np.random.default_rng(seed))
    assert b.inputs.shape == b.targets.shape == (batch, task.tokens_per_sequence(length))
    assert int(b.inputs.min()) >= 0 and int(b.inputs.max()) < task.vocab_size
    valid = b.targets[b.targets != IGNORE_INDEX]
    assert int(valid.min()) >= 0 and int(valid.max()) < task.vocab_size
    return task, b.inputs.tolist(), b.targets.tolist()


@pytest.mark.parametrize("num_elements", [2, 5, 7])
def test_swaps_follow_the_element_at_position_zero(num_elements: int) -> None:
    pairs = list(itertools.combinations(range(num_elements), 2))
    _, inputs, targets = sample("swaps", {"num_elements": num_elements}, length=40)
    for swaps, labels in zip(inputs, targets, strict=True):
        row = list(range(num_elements))
        for token, label in zip(swaps, labels, strict=True):
            i, j = pairs[token]
            row[i], row[j] = row[j], row[i]
            assert label == row[0]


@pytest.mark.parametrize("group", GROUPS)
def test_word_problem_labels_are_running_products(group: str) -> None:
    elements = group_elements(group)
    expected_order = {"S3": 6, "S4": 24, "A5": 60, "S5": 120}[group]
    assert len(set(elements)) == expected_order
    _, inputs, targets = sample("word_problem", {"group": group}, length=30)
    for word, labels in zip(inputs, targets, strict=True):
        state = list(range(len(elements[0])))  # P[i]: where the prefix sends i
        for token, label in zip(word, labels, strict=True):
            g = elements[token]
            state = [g[state[i]] for i in range(len(state))]
            assert elements[label] == tuple(state)


def test_a5_is_closed_and_holds_only_even_permutations() -> None:
    elements = set(group_elements("A5"))
    for a, b in itertools.product(elements, repeat=2):
        assert tuple(a[i] for i in b) in elements
    assert tuple(range(5)) in elements and (1, 0, 2, 3, 4) not in elements


def test_parity_is_the_running_xor() -> None:
    _, inputs, targets = sample("parity", {}, length=50)
    for bits, labels in zip(inputs, targets, strict=True):
        assert labels == [sum(bits[: t + 1]) % 2 for t in range(len(bits))]


@pytest.mark.parametrize("nodes", [1, 2, 9, 32])
def test_reachability_labels_match_a_graph_search(nodes: int) -> None:
    task, inputs, targets = sample("reachability", {"name_vocab": 40}, length=nodes)
    for tokens, labels in zip(inputs, targets, strict=True):
        assert tokens[0] == task.start_token
        triples = [tokens[2 + 3 * v : 5 + 3 * v] for v in range(nodes)]
        names = [t[0] for t in triples]
        assert len(set(names)) == nodes and triples[0][1:] == [task.none_token] * 2
        children: dict[int, set[int]] = {name: set() for name in names}
        for v, (name, p1, p2) in enumerate(triples[1:], start=1):
            assert names.index(p1) < v and names.index(p2) < v  # parents come earlier: a DAG
            children[p1].add(name)
            children[p2].add(name)
        reached, frontier = {tokens[1]}, [tokens[1]]
        while frontier:
            for child in children[frontier.pop()]:
                if child not in reached:
                    reached.add(child)
                    frontier.append(child)
        expected = [IGNORE_INDEX] * (2 + 3 * nodes)
        for v, name in enumerate(names):
            expected[4 + 3 * v] = int(name in reached)
        assert labels == expected


def test_reachability_labels_are_not_constant() -> None:
    _, _, targets = sample("reachability", {}, length=32, batch=64)
    labels = [y for row in targets for y in row if y != IGNORE_INDEX]
    assert 0.1 < sum(labels) / len(labels) < 0.9


@pytest.mark.parametrize("num_queries", [None, 3])
def test_mqar_targets_are_the_bound_values(num_queries: int | None) -> None:
    pairs = 10
    task, inputs, targets = sample(
        "mqar", {"num_keys": 20, "num_values": 7, "num_queries": num_queries}, pairs
    )
    for tokens, labels in zip(inputs, targets, strict=True):
        context = tokens[: 2 * pairs]
        keys, values = context[0::2], context[1::2]
        assert len(set(keys)) == pairs and all(
            k < task.num_keys <= v for k, v in zip(keys, values, strict=True)
        )
        binding = dict(zip(keys, values, strict=True))
        queries = tokens[2 * pairs :]
        assert len(queries) == (pairs if num_queries is None else num_queries) == len(set(queries))
        assert labels[: 2 * pairs] == [IGNORE_INDEX] * (2 * pairs)
        assert labels[2 * pairs :] == [binding[q] for q in queries]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_generators_are_seeded(name: str) -> None:
    _, a, _ = sample(name, {}, length=8, seed=3)
    _, b, _ = sample(name, {}, length=8, seed=3)
    _, c, _ = sample(name, {}, length=8, seed=4)
    assert a == b and a != c


@pytest.mark.parametrize(
    ("name", "options", "length", "field"),
    [
        ("swaps", {"num_elements": 1}, 4, "num_elements"),
        ("word_problem", {"group": "D4"}, 4, "group"),
        ("reachability", {"name_vocab": 8}, 9, "name_vocab"),
        ("mqar", {"num_keys": 4}, 5, "num_keys"),
        ("parity", {}, 0, "length"),
        ("swaps", {"elements": 3}, 4, "elements"),
    ],
)
def test_bad_task_settings_name_the_field(name: str, options: dict, length: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build_task(name, options).sample(length, 2, np.random.default_rng(0))
