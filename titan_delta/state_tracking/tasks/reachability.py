"""DAG reachability (DeltaFormer paper §4.2): which nodes can be reached from a start node?

A DAG on n nodes is the union of two random recursive trees over one topological order: node v ≥ 1 gets
a parent p1(v) and a parent p2(v), each uniform among nodes 0..v-1 (node 0 is the root of both). Nodes
carry distinct random names from a pool of ``name_vocab`` names, so position does not give a node away.

Sequence: ``START s`` (the start node's name), then for every node in topological order the triple
``v p1(v) p2(v)`` (``NONE NONE`` for the root's parents). The target, on the last token of a triple,
is 1 when v is reachable from s (v = s, or a parent is reachable) and 0 otherwise: solving it means
looking up the answers already given for the parents, a chain of dependencies as deep as the graph.
``length`` = number of nodes; a sequence has 2 + 3·length tokens.
"""

from __future__ import annotations

import numpy as np

from titan_delta.state_tracking.tasks.base import IGNORE_INDEX, StateTrackingTask, require_positive


class DagReachabilityTask(StateTrackingTask):
    name = "reachability"
    length_unit = "nodes"

    def __init__(self, name_vocab: int = 128) -> None:
        self.name_vocab = require_positive(self.name, "name_vocab", name_vocab, minimum=2)
        self.none_token = self.name_vocab
        self.start_token = self.name_vocab + 1

    @property
    def vocab_size(self) -> int:
        return self.name_vocab + 2  # names, NONE, START; targets 0/1 reuse the first two ids

    def tokens_per_sequence(self, length: int) -> int:
        return 2 + 3 * length

    def check_length(self, length: int) -> None:
        super().check_length(length)
        if length > self.name_vocab:
            raise ValueError(
                f"task {self.name}: {length} nodes need distinct names but name_vocab={self.name_vocab}; "
                "raise task.name_vocab"
            )

    def generate(
        self, length: int, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        n, B = length, batch_size
        rows = np.arange(B)
        names = np.argsort(rng.random((B, self.name_vocab)), axis=1)[:, :n]  # distinct names per sequence
        upper = np.maximum(np.arange(n), 1)  # parents of v are drawn from 0..v-1 (root: placeholder 0)
        parents = (rng.random((B, 2, n)) * upper).astype(np.int64)
        start = rng.integers(0, n, size=B)
        reachable = np.zeros((B, n), dtype=bool)
        for v in range(n):
            from_parents = reachable[rows, parents[:, 0, v]] | reachable[rows, parents[:, 1, v]]
            reachable[:, v] = (start == v) | ((v > 0) & from_parents)
        inputs = np.empty((B, self.tokens_per_sequence(n)), dtype=np.int64)
        targets = np.full_like(inputs, IGNORE_INDEX)
        inputs[:, 0] = self.start_token
        inputs[:, 1] = names[rows, start]
        triples = inputs[:, 2:].reshape(B, n, 3)  # a view: writes land in `inputs`
        triples[:, :, 0] = names
        triples[:, :, 1] = np.take_along_axis(names, parents[:, 0], axis=1)
        triples[:, :, 2] = np.take_along_axis(names, parents[:, 1], axis=1)
        triples[:, 0, 1:] = self.none_token
        targets[:, 4::3] = reachable
        return inputs, targets
