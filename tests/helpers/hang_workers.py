"""Functions that `DDPStrategy.launch` runs to provoke the hang guard (module level: spawn
imports them by name). Each one makes the ranks stop meeting in the same collective."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from strategies import DDPStrategy
from strategies.checkpoint_io import TorchCheckpointIO


def extra_barrier_on_rank_zero(strategy: DDPStrategy) -> None:
    """Rank 0 waits in a barrier that rank 1 never calls; rank 1 waits in a reduce instead."""
    if strategy.global_rank == 0:
        strategy.barrier("only rank zero")
    strategy.reduce(torch.ones(3))


def rank_one_never_arrives(strategy: DDPStrategy) -> None:
    """Rank 1 is busy in its own code while rank 0 waits for it in a reduce."""
    if strategy.global_rank == 1:
        time.sleep(120)
    strategy.reduce(torch.ones(3))


def mismatched_shapes(strategy: DDPStrategy) -> None:
    """The same operation with different shapes: gloo would pair them and abort."""
    strategy.reduce(torch.ones(1 if strategy.global_rank == 0 else 3))


def matched_collectives(strategy: DDPStrategy) -> float:
    """A correct program: the debug fingerprints must let it through."""
    total = 0.0
    for step in range(5):
        total += float(strategy.reduce(torch.full((2,), float(step + strategy.global_rank)), reduce_op="sum").sum())
        strategy.barrier("step")
    return total


class SlowCheckpointIO(TorchCheckpointIO):
    """Writing takes longer than the stall timeout, as a large checkpoint on a slow disk would."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def save(self, checkpoint: dict[str, Any], path: Any) -> None:
        time.sleep(self.seconds)
        super().save(checkpoint, path)


def slow_checkpoint(strategy: DDPStrategy, path: str) -> bool:
    """Rank 0 writes for longer than stall_timeout while rank 1 waits in the save barrier."""
    strategy.save_checkpoint({"weights": torch.ones(2)}, path)
    return Path(path).exists()
