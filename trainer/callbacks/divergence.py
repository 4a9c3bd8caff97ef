"""DivergenceGuard: prove every N steps that all ranks hold the same parameters.

DDP's promise is identical weights everywhere; a rank-dependent bug (a non-deterministic
kernel, a rank-local buffer update, an optimizer touched on one rank only) silently breaks it.
A per-parameter checksum costs one small all_gather; the error names the first parameter
that differs, so the bug can be found.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from trainer.callbacks.base import Callback
from trainer.contract import TrainerContract


class DivergenceError(RuntimeError):
    """Ranks hold different parameters; the message names the first one and the ranks."""


class DivergenceGuard(Callback):
    def __init__(self, every_n_steps: int = 100) -> None:
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"DivergenceGuard(every_n_steps={every_n_steps!r}) must be an int >= 1.")
        self.every_n_steps = every_n_steps
        self.checks = 0
        self._last_checked_step = -1

    @override
    def on_train_batch_end(self, trainer: TrainerContract, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every_n_steps == 0 and step != self._last_checked_step:
            self._last_checked_step = step
            self.check(trainer, pl_module)

    @override
    def on_train_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        if trainer.global_step != self._last_checked_step:
            self.check(trainer, pl_module)

    def check(self, trainer: TrainerContract, pl_module: Any) -> None:
        """Collective: every rank calls it at the same step."""
        named = list(pl_module.named_parameters())
        if not named:
            return
        names = [name for name, _ in named]
        params = [param for _, param in named]
        # Sum and sum of squares: a permutation of values changes the second.
        local = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().square().sum()])
                             for p in params])
        gathered = trainer.strategy.all_gather_ranks(local)  # (world_size, n_params, 2)
        self.checks += 1
        differs = (gathered != gathered[0]).any(dim=2)  # (world_size, n_params)
        if bool(differs.any()):
            ranks, indexes = differs.nonzero(as_tuple=True)
            first = int(indexes.min())
            bad_ranks = sorted({int(r) for r, i in zip(ranks, indexes) if int(i) == first})
            raise DivergenceError(f"step {trainer.global_step}: parameter {names[first]!r} differs between rank 0 "
                                  f"and rank(s) {bad_ranks} (checksums {gathered[:, first, 0].tolist()}). Ranks must "
                                  "hold identical weights: look for rank-dependent code touching parameters.")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"checks": self.checks}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.checks = state_dict.get("checks", 0)
