"""Data-parallel evaluation on a live (possibly FSDP-sharded) model: each rank scores a share of the rows,
every rank runs the same number of forwards, and the results are gathered on every rank.

A sharded model all-gathers its parameters inside every forward, collectively: a rank that skipped a
forward would leave the others waiting forever. So the number of batches is agreed on up front, ranks
that run out of work run a one-token dummy forward instead, and generation agrees on every step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class RankShare:
    """This process's place among the ranks that evaluate together (one rank when not distributed)."""

    def __init__(self, group: Any = None) -> None:
        self.enabled = dist.is_available() and dist.is_initialized()
        self.group = group if self.enabled else None
        self.rank = dist.get_rank(group) if self.enabled else 0
        self.world_size = dist.get_world_size(group) if self.enabled else 1
        self.device = torch.device("cpu")
        if self.enabled and dist.get_backend(group) == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())

    def mine(self, items: list[T]) -> list[T]:
        """Every world_size-th item from this rank's index: ranks get similar lengths when ``items`` is
        sorted by length."""
        return items[self.rank :: self.world_size]

    def max_over_ranks(self, value: int) -> int:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def any_rank(self, flag: bool) -> bool:
        return self.max_over_ranks(int(flag)) > 0

    def gather(self, mine: list[T]) -> list[T]:
        """Concatenation of every rank's list, in rank order, on every rank."""
        if not self.enabled:
            return list(mine)
        parts: list[list[T] | None] = [None] * self.world_size
        dist.all_gather_object(parts, mine, group=self.group)
        return [item for part in parts for item in (part or [])]

    def lockstep(self, batches: list[T], run: Callable[[T], None], idle: Callable[[], None]) -> None:
        """``run`` each of this rank's batches, then ``idle`` until every rank has run as many calls."""
        rounds = self.max_over_ranks(len(batches))
        for i in range(rounds):
            if i < len(batches):
                run(batches[i])
            else:
                idle()
