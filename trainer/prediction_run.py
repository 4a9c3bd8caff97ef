"""One `predict()` run as prediction writers see it: each batch's dataset indices and the predictions.

A prediction writer (Lightning's `BasePredictionWriter`, or ours) saves what `predict_step` returns
next to the indices of the samples it came from, so the files each rank writes can be put back in
dataset order. The indices are the ones the rank's sampler drew (with a distributed sampler: indices
into the whole dataset). They are recorded by wrapping the loader's batch sampler, which the
DataLoader reads in this process even when worker processes load the data.

Lightning's names, read through `trainer.predict_loop`: `current_batch_indices` (the batch whose
`on_predict_batch_end` runs), `epoch_batch_indices` (per dataloader, every batch's) and
`predictions` (kept when `predict()` returns them or a writer writes at epoch end).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from strategies.sampler import rebuild_with_batch_sampler


class IndexRecordingBatchSampler:
    """The wrapped batch sampler's batches, each one's indices kept in `seen` (in the order drawn)."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler
        self.seen: list[list[int]] = []

    @property
    def sampler(self) -> Any:
        """The sampler inside, so code that sets a distributed sampler's epoch still finds it."""
        return getattr(self.batch_sampler, "sampler", None)

    def __iter__(self) -> Iterator[list[int]]:
        self.seen = []
        for batch in self.batch_sampler:
            self.seen.append(list(batch))
            yield batch

    def __len__(self) -> int:
        return len(self.batch_sampler)


def is_prediction_writer(callback: Any) -> bool:
    """Ours or Lightning's `BasePredictionWriter` (both say when they write through `interval`)."""
    interval = getattr(callback, "interval", None)
    return callable(getattr(callback, "write_on_batch_end", None)) and hasattr(interval, "on_epoch")


@dataclass
class PredictionRun:
    """The state of one predict run that writers read; `loaders` are the ones to iterate (a
    DataLoader's batch sampler wrapped when a writer needs indices)."""

    loaders: list[Any]
    keep_predictions: bool
    recorders: list[IndexRecordingBatchSampler | None] = field(default_factory=list)
    on_batch: bool = False
    on_epoch: bool = False
    predictions: list[list[Any]] = field(default_factory=list)
    epoch_batch_indices: list[list[list[int]]] = field(default_factory=list)
    current_batch_indices: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, loaders: list[Any], callbacks: list[Any], return_predictions: bool) -> PredictionRun:
        writers = [callback for callback in callbacks if is_prediction_writer(callback)]
        on_batch = any(writer.interval.on_batch for writer in writers)
        on_epoch = any(writer.interval.on_epoch for writer in writers)
        recorders = [IndexRecordingBatchSampler(loader.batch_sampler) if writers and _has_indices(loader) else None
                     for loader in loaders]
        recording = [loader if recorder is None else rebuild_with_batch_sampler(loader, recorder)
                     for loader, recorder in zip(loaders, recorders)]
        return cls(loaders=recording, keep_predictions=return_predictions or on_epoch, recorders=recorders,
                   on_batch=on_batch, on_epoch=on_epoch, predictions=[[] for _ in loaders],
                   epoch_batch_indices=[[] for _ in loaders])

    def batch_done(self, batch_idx: int, loader_idx: int) -> None:
        """Before the batch's end hooks: the indices writers read for it."""
        recorder = self.recorders[loader_idx]
        if recorder is None or batch_idx >= len(recorder.seen):
            return
        indices = recorder.seen[batch_idx]
        if self.on_epoch:
            self.epoch_batch_indices[loader_idx].append(indices)
        if self.on_batch:
            self.current_batch_indices = indices

    def add(self, output: Any, loader_idx: int) -> None:
        if self.keep_predictions:
            self.predictions[loader_idx].append(output)

    def results(self) -> Any:
        """Lightning's shape: one loader's list, or a list per loader."""
        return self.predictions[0] if len(self.predictions) == 1 else self.predictions


def _has_indices(loader: Any) -> bool:
    """Whether the loader's batches come from dataset indices a writer can be given. An iterable dataset's
    DataLoader draws from no index sampler (and refuses a batch sampler): its writers get no indices."""
    return (isinstance(loader, DataLoader) and loader.batch_sampler is not None
            and not isinstance(loader.dataset, IterableDataset))
