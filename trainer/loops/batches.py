"""A stage's batches: iterated up to its limit (counted in trainer/batch_counts.py), placed on the device,
and stopping together on uneven training data.

Uneven inputs (Join-style): a training loader over an `IterableDataset` cannot be padded, so
ranks may hold different numbers of batches, and a rank that runs out would leave its peers
waiting forever in the next gradient all-reduce. Instead, before each batch every rank says
whether it still has one (one 1-element all-reduce, MIN) and all stop at the first batch some
rank lacks: the epoch ends for everyone together, and the surplus batches of the longer ranks
are dropped for that epoch (like `drop_last`). Map-style data is padded by the sampler instead
and pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

from trainer.batch_counts import members, num_batches
from trainer.data_sources import overrides
from trainer.precision import move_to_device
from trainer.profiler import is_profiling
from trainer.loops.step_iterator import takes_dataloader_iter
from trainer.stage import Stage

_EXHAUSTED = object()  # "this rank has no batch left"


def iterate_limited(parts: Stage, loader: Any, stage: str, skip: int = 0,
                    on_resumed: Callable[[], None] | None = None, start_at: int = 0,
                    dataloader_idx: int = 0, limit: int | None = None,
                    opened: Iterator[Any] | None = None) -> Iterator[tuple[int, Any]]:
    """Yield `(batch_idx, batch on this rank's device)`, stopping at the stage's limit.

    `skip` fast-forwards a resumed epoch: skipped batches are drawn from the loader (so the
    sampler order matches the interrupted run) but not moved or computed on. `on_resumed` runs
    where the checkpoint was taken: before the iterator is built when the epoch starts fresh,
    else once the finished batches are drawn and before the next one is fetched. `start_at`
    numbers the batches from there without drawing any: the loader's sampler already starts
    mid-epoch (a resume on another number of processes), so its length is what is left.
    `limit` overrides the stage's batch limit (the sanity check's few batches). `opened` is the
    loader's iterator when it was created ahead (`open_loader`), else one is created here.
    """
    limit = num_batches(parts.live, loader, stage) if limit is None else limit
    if limit == 0:
        return
    batches: Iterable[Any] = loader if opened is None else opened
    if stage == "train" and parts.strategy.world_size > 1 and _may_be_uneven(loader):
        batches = stop_together(parts.strategy, batches)
    if on_resumed is not None and skip == 0:
        on_resumed()  # the checkpoint was taken between epochs, before this iterator existed
    iterator = iter(batches)
    if is_profiling(parts.profiler):
        iterator = _timed(iterator, parts.profiler, f"{stage}_dataloader_next")
    ahead = _fetching_ahead(parts, stage, limit, iterator)
    iterator = ahead or iterator
    for _ in range(skip if limit < 0 else min(skip, limit)):
        if next(iterator, _EXHAUSTED) is _EXHAUSTED:
            return
    if on_resumed is not None and skip > 0:
        on_resumed()  # mid-epoch: after the finished batches, before the next one
    batch_idx = skip + start_at
    while limit < 0 or batch_idx - start_at < limit:  # never fetch past the limit (as Lightning): a fetch
        batch = next(iterator, _EXHAUSTED)             # runs the dataset's random transforms
        if batch is _EXHAUSTED:
            return
        if ahead is not None:  # the next batch is fetched already: whether this one is the last is known
            parts.fit_run.is_last_batch = ahead.done
        batch = transfer_batch(parts, batch, dataloader_idx)
        parts.metrics.current_batch_size = _batch_size(batch)
        yield batch_idx, batch
        batch_idx += 1


class FetchAhead:
    """An iterator that fetches one item ahead of the one it hands out, so `done` says whether that item
    was the last: Lightning's prefetching fetcher, which tells `is_last_batch` for a training loader
    without a length. The item ahead is fetched raw (its transfer hooks run when it is handed out)."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator, self.done = iterator, False
        self._ahead: Any = None
        self._started = False

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if not self._started:
            self._ahead, self._started = next(self._iterator, _EXHAUSTED), True
        current = self._ahead
        if current is _EXHAUSTED:
            self.done = True
            raise StopIteration
        self._ahead = next(self._iterator, _EXHAUSTED)
        self.done = self._ahead is _EXHAUSTED
        return current


def _fetching_ahead(parts: Stage, stage: str, limit: int, iterator: Iterator[Any]) -> FetchAhead | None:
    """Training on a loader without a length (no batch limit either) fetches ahead, as Lightning does; a
    `training_step(dataloader_iter)` fetches its own batches, and evaluation never needs to know."""
    module = parts.module
    if stage != "train" or limit >= 0 or takes_dataloader_iter(getattr(module, "training_step", None)):
        return None
    return FetchAhead(iterator)


def _timed(iterator: Iterator[Any], profiler: Any, action: str) -> Iterator[Any]:
    """`iterator`, each fetch timed as `action` (loading and collating the next batch)."""
    while True:
        with profiler.profile(action):
            batch = next(iterator, _EXHAUSTED)
        if batch is _EXHAUSTED:
            return
        yield batch


def transfer_batch(parts: Stage, batch: Any, dataloader_idx: int) -> Any:
    """Lightning's order: precision conversion, then on_before_batch_transfer,
    transfer_batch_to_device and on_after_batch_transfer, each the DataModule's when it overrides
    it, else the module's (plain device placement for a module without them)."""
    batch = parts.precision.convert_input(batch)
    module, device = parts.module, parts.strategy.root_device
    if module is None or not callable(getattr(module, "transfer_batch_to_device", None)):
        return move_to_device(batch, device)

    def call(hook: str, *args: Any) -> Any:
        owner = parts.datamodule if overrides(parts.datamodule, hook) else module
        return parts.callbacks.call_module(hook, owner, *args)

    batch = call("on_before_batch_transfer", batch, dataloader_idx)
    batch = call("transfer_batch_to_device", batch, device, dataloader_idx)
    return call("on_after_batch_transfer", batch, dataloader_idx)


def _may_be_uneven(loader: Any) -> bool:
    """Iterable-style data has no indices to pad, so its per-rank lengths are not ours to equalise."""
    return any(isinstance(getattr(member, "dataset", None), IterableDataset) or not hasattr(member, "__len__")
               for member in members(loader))


def open_loader(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's iterator, created now. Creating one draws the DataLoader's base seed from torch's
    generator (and starts its worker processes), so *when* it is created decides what later draws see:
    Lightning creates the first epoch's before `on_train_start`."""
    return iter(loader)


def stop_together(strategy: Any, loader: Iterable[Any]) -> Iterator[Any]:
    """Yield batches while *every* rank still has one; see the module docstring. Each rank must
    iterate it the same number of times (the fit loop does: it breaks on shared conditions)."""
    iterator = iter(loader)
    while True:
        batch = next(iterator, _EXHAUSTED)
        have = torch.tensor([0 if batch is _EXHAUSTED else 1], dtype=torch.int32)
        if int(strategy.reduce(have, reduce_op="min").item()) == 0:
            return
        yield batch


def _batch_size(batch: Any) -> int | None:
    """Lightning's inference: the length of the first tensor found in the batch."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = _batch_size(item)
            if size is not None:
                return size
    return None


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """DistributedSampler shuffles by epoch: without this every epoch repeats one order. Each
    sampler once (a loader's `sampler` is usually also its batch sampler's `sampler`)."""
    seen: set[int] = set()
    for member in members(loader):
        for source in (getattr(member, "sampler", None), getattr(member, "batch_sampler", None)):
            for candidate in (source, getattr(source, "sampler", None)):
                set_epoch = getattr(candidate, "set_epoch", None)
                if callable(set_epoch) and id(candidate) not in seen:
                    seen.add(id(candidate))
                    set_epoch(epoch)
