"""A callback that proves all ranks hold identical parameters, reported back to the launcher."""

from __future__ import annotations

from typing import Any

import torch

from trainer.callbacks.base import Callback


class RankAgreement(Callback):
    """At the end of fit, gather every parameter from all ranks and record the largest
    difference from rank 0's copy (0.0 means bit-for-bit identical)."""

    def __init__(self) -> None:
        self.max_rank_diff: float = -1.0
        self.world_size: int = 0

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        worst = 0.0
        for parameter in pl_module.parameters():
            gathered = trainer.strategy.all_gather(parameter.detach())
            worst = max(worst, float((gathered - gathered[0]).abs().max()))
        self.max_rank_diff, self.world_size = worst, trainer.world_size

    def state_dict(self) -> dict[str, Any]:
        return {"max_rank_diff": self.max_rank_diff, "world_size": self.world_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.max_rank_diff = state_dict["max_rank_diff"]
        self.world_size = state_dict["world_size"]


def max_param_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((x.detach() - y.detach()).abs().max()) for x, y in zip(a.parameters(), b.parameters()))


class SaveAtEnd(Callback):
    """Every rank calls the collective `save_checkpoint` at the end of fit (rank 0 writes)."""

    def __init__(self, path: Any) -> None:
        self.path = path

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        trainer.save_checkpoint(self.path)
