"""BasePredictionWriter: save predictions as they are made, on every rank, with the samples' indices.

With several processes, `predict()` returns only rank 0's predictions; a writer lets each rank save
its own share (with the dataset indices of each batch, so the shares can be put back in order), and
keeps memory flat for large runs when it writes per batch with `return_predictions=False`.
Subclass it and implement `write_on_batch_end` and/or `write_on_epoch_end` (Lightning's names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from typing_extensions import override

from trainer.callbacks.base import Callback
from trainer.contract import TrainerContract

WriteInterval = Literal["batch", "epoch", "batch_and_epoch"]


@dataclass(frozen=True)
class Interval:
    """When a writer writes: after each batch, once the predict epoch ends, or both."""

    on_batch: bool
    on_epoch: bool

    @classmethod
    def named(cls, name: str) -> Interval:
        choices = {"batch": cls(True, False), "epoch": cls(False, True), "batch_and_epoch": cls(True, True)}
        if name not in choices:
            raise ValueError(f"write_interval={name!r} is not one of {list(choices)}.")
        return choices[name]


class BasePredictionWriter(Callback):
    """`write_interval`: "batch" calls `write_on_batch_end` after every predicted batch, "epoch"
    calls `write_on_epoch_end` once with every prediction and batch index, "batch_and_epoch" both."""

    def __init__(self, write_interval: WriteInterval = "batch") -> None:
        self.interval = Interval.named(write_interval)

    def write_on_batch_end(self, trainer: TrainerContract, pl_module: Any, prediction: Any,
                           batch_indices: Sequence[int] | None, batch: Any, batch_idx: int,
                           dataloader_idx: int) -> None:
        """Save one batch's `prediction`; `batch_indices` are its samples' indices in the dataset."""
        raise NotImplementedError(f"{type(self).__name__} writes per batch: implement write_on_batch_end().")

    def write_on_epoch_end(self, trainer: TrainerContract, pl_module: Any, predictions: Sequence[Any],
                           batch_indices: Sequence[Any]) -> None:
        """Save every prediction of this rank; `batch_indices[dataloader][batch]` are the indices."""
        raise NotImplementedError(f"{type(self).__name__} writes per epoch: implement write_on_epoch_end().")

    @override
    def on_predict_batch_end(self, trainer: TrainerContract, pl_module: Any, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.interval.on_batch:
            indices = trainer.predict_loop.current_batch_indices
            self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    @override
    def on_predict_epoch_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        if self.interval.on_epoch:
            loop = trainer.predict_loop
            self.write_on_epoch_end(trainer, pl_module, loop.predictions, loop.epoch_batch_indices)
