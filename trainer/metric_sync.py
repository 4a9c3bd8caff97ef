"""Reduce logged scalars over ranks: any mix of sum, max and min in ONE all-reduce.

`self.log(..., sync_dist=True)` values are reduced at fixed sync points of the loop that every rank
reaches alike (trainer/logged_metrics.py). Everything due at one point travels in one collective
(a float64 vector), never one per key: sums are stacked as they are, and max/min values are placed
in this rank's row of a (world size, k) block of zeros, so summing gathers them (x + 0 is exact)
and each rank then takes the max/min of the rows itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

Reducer = Callable[..., torch.Tensor]  # a strategy's reduce(tensor, reduce_op=...)
Request = tuple[str, torch.Tensor]  # (op: "sum" | "max" | "min", float64 scalar)


class RankInfo(Protocol):
    """What packing max/min values into the same all-reduce as the sums needs (a Strategy has it)."""

    @property
    def global_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...


def f64(value: Any) -> torch.Tensor:
    """A float64 scalar on the CPU: the one dtype and device of every reduction request."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=torch.float64).reshape(())
    return torch.tensor(float(value), dtype=torch.float64)


def reduce_many(reduce: Reducer, ranks: RankInfo | None, requests: list[Request]) -> list[torch.Tensor]:
    """Each request's value reduced over ranks by its op, in request order. Without `ranks`
    (which row is this rank's) max/min values take a second collective."""
    sums = [value for op, value in requests if op == "sum"]
    extremes = [(op, value) for op, value in requests if op != "sum"]
    if extremes and ranks is None:
        return _reduce_two_collectives(reduce, requests)
    rank, world = (ranks.global_rank, ranks.world_size) if ranks else (0, 1)
    buffer = torch.zeros(len(sums) + world * len(extremes), dtype=torch.float64)
    buffer[:len(sums)] = torch.stack(sums) if sums else buffer[:0]
    if extremes:
        start = len(sums) + rank * len(extremes)
        buffer[start:start + len(extremes)] = torch.stack([value for _, value in extremes])
    reduced = reduce(buffer, reduce_op="sum").to(torch.float64)
    summed = iter(reduced[:len(sums)])
    rows = reduced[len(sums):].reshape(world, len(extremes))
    gathered = iter((rows[:, i].max() if op == "max" else rows[:, i].min()) for i, (op, _) in enumerate(extremes))
    return [next(summed) if op == "sum" else next(gathered) for op, _ in requests]


def _reduce_two_collectives(reduce: Reducer, requests: list[Request]) -> list[torch.Tensor]:
    """Fallback without rank information: sums in one all-reduce, max/min (min negated) in one."""
    sums = [value for op, value in requests if op == "sum"]
    signed = [value if op == "max" else -value for op, value in requests if op != "sum"]
    summed = iter(reduce(torch.stack(sums), reduce_op="sum") if sums else ())
    maxed = iter(reduce(torch.stack(signed), reduce_op="max"))
    return [next(summed) if op == "sum" else (next(maxed) if op == "max" else -next(maxed)) for op, _ in requests]
