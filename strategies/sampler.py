"""Give each rank its own shard of a DataLoader, explicitly.

We rebuild a plain `DataLoader` from its public fields with a `DistributedSampler` instead of
patching `DataLoader.__init__` to remember constructor arguments: a subclass or a custom
sampler has semantics we cannot reproduce, so we refuse it with a message saying what to do.

`DistributedSampler` pads the index list so every rank gets the same number of samples (and
therefore batches): uneven shards would leave one rank waiting in a collective forever.
Remember its docstring's warning: call `loader.sampler.set_epoch(epoch)` at the start of every
epoch (our fit loop does), or every epoch reuses the first epoch's order.

Evaluation wants the opposite trade: `pad=False` gives `ShardSampler`, disjoint shards that
cover every sample exactly once (lengths may differ by one), because a padded duplicate is
counted twice in validation metrics. That is safe only because the evaluation loop issues no
collective per batch (all metric sync happens once, at epoch end), so a rank with one batch
fewer never leaves a peer waiting.

A loader with a sampler of its own (a `WeightedRandomSampler`, a custom one) keeps it, as in Lightning:
`SamplerShards` draws it in full on every rank each epoch and hands each rank its share of the draws
(padded in training, exactly once in evaluation). Prediction always keeps the loader's sampler, even a
`RandomSampler`, so the order (and the draws from torch's generator) are the loader's own, as
Lightning's prediction does.

An `IterableDataset` is returned unchanged: it has no indices to split, so the dataset itself
must shard (e.g. by `torch.distributed.get_rank()` inside `__iter__`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler,
                              SequentialSampler)
from typing_extensions import override

SEED_VARIABLE = "PL_GLOBAL_SEED"
_HINT = "pass use_distributed_sampler=False to the Trainer and build the sampler yourself"


class ShardSampler(Sampler[int]):
    """Rank `rank`'s indices `rank, rank + N, rank + 2N, ...` of `range(len(dataset))` (or of one
    seeded permutation of it), without padding: the shards are disjoint and together cover every
    index exactly once. The same striding as DistributedSampler, minus its repeated tail."""

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, shuffle: bool = False, seed: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}.")
        self.dataset_size, self.num_replicas, self.rank = len(dataset), num_replicas, rank
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    @override
    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_size, generator=generator).tolist()
        else:
            order = list(range(self.dataset_size))
        return iter(order[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return len(range(self.rank, self.dataset_size, self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class ResumableDistributedSampler(DistributedSampler):
    """`DistributedSampler` that can begin an epoch part-way through its *global* sample order.

    With `start_sample = 0` it yields exactly what `DistributedSampler(drop_last=False)` yields.
    After `set_start_sample(k)` it yields this rank's share of the epoch's order without its
    first `k` samples, re-padded for the current number of replicas: a run checkpointed after
    `k` global samples and resumed on another number of processes continues the same stream
    (`k` counts samples in the order, so it does not depend on how many ranks consumed them).
    `set_epoch` clears the start: only the resumed epoch is partial.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,  # type: ignore[arg-type]
                         seed=seed, drop_last=False)
        self.start_sample = 0

    def set_start_sample(self, start_sample: int) -> None:
        size = len(self.dataset)  # type: ignore[arg-type]
        if not 0 <= start_sample <= size:
            raise ValueError(f"start_sample must be in [0, {size}] (the dataset size), got {start_sample}.")
        self.start_sample = start_sample

    @override
    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.start_sample = 0

    @override
    def __iter__(self) -> Iterator[int]:
        if self.start_sample == 0:
            return super().__iter__()
        remaining = self._epoch_order()[self.start_sample:]
        padding = -len(remaining) % self.num_replicas
        # Like DistributedSampler, pad with the epoch's first samples (repeated if needed).
        order = self._epoch_order()
        remaining += (order * (padding // max(len(order), 1) + 1))[:padding]
        return iter(remaining[self.rank::self.num_replicas])

    @override
    def __len__(self) -> int:
        remaining = len(self.dataset) - self.start_sample  # type: ignore[arg-type]
        return -(-remaining // self.num_replicas)

    def _epoch_order(self) -> list[int]:
        size = len(self.dataset)  # type: ignore[arg-type]
        if not self.shuffle:
            return list(range(size))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)  # DistributedSampler's order
        return torch.randperm(size, generator=generator).tolist()


class SamplerShards(Sampler[Any]):
    """Rank `rank`'s share of what another sampler draws. Each epoch (`__iter__`) the inner sampler is
    drawn in full, in its own order and with its own randomness (every rank draws the same when the
    ranks' generators agree, as `seed_everything` makes them); the positions of the draws are permuted
    by a generator seeded with `seed + epoch` when `shuffle`, then strided `rank, rank + N, ...`:
    padded with the first positions (`pad`, training: every rank the same number of steps) or not
    (evaluation and prediction: every draw exactly once). `set_epoch` also reaches the inner sampler."""

    def __init__(self, sampler: Iterable[Any], num_replicas: int, rank: int, *, shuffle: bool, seed: int,
                 pad: bool) -> None:
        if not isinstance(sampler, Sized) or len(sampler) == float("inf"):
            raise TypeError(f"Cannot shard the DataLoader's {type(sampler).__qualname__} across {num_replicas} "
                            f"processes: it has no finite length; give it a __len__, or {_HINT}.")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}.")
        self.sampler, self.num_replicas, self.rank = sampler, num_replicas, rank
        self.shuffle, self.seed, self.pad, self.epoch = shuffle, seed, pad, 0

    @override
    def __iter__(self) -> Iterator[Any]:
        drawn = list(self.sampler)
        positions = self._positions(len(drawn))
        return (drawn[position] for position in positions[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return len(range(self.rank, self._total(len(self.sampler)), self.num_replicas))  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        inner = getattr(self.sampler, "set_epoch", None)
        if callable(inner):
            inner(epoch)

    def _positions(self, size: int) -> list[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            positions = torch.randperm(size, generator=generator).tolist()
        else:
            positions = list(range(size))
        padding = self._total(size) - size
        return positions + (positions * (padding // max(size, 1) + 1))[:padding]

    def _total(self, size: int) -> int:
        return -(-size // self.num_replicas) * self.num_replicas if self.pad else size


def distribute_dataloader(dataloader: DataLoader, num_replicas: int, rank: int,
                          seed: int | None = None, pad: bool = True, shuffle: bool | None = None,
                          keep_sampler: bool = False) -> DataLoader:
    """A DataLoader that yields only this rank's shard.

    `pad=True` (training) pads like DistributedSampler so every rank runs the same number of
    steps; `pad=False` (evaluation, prediction) covers each sample exactly once (`ShardSampler`).
    `shuffle` permutes the shards each epoch; None keeps the loader's own setting (a `RandomSampler`
    shuffles, any other sampler does not). A sampler other than a `RandomSampler`/`SequentialSampler`
    is kept and its draws sharded (`SamplerShards`), and so is every sampler with `keep_sampler`
    (prediction: the loader's own order, as Lightning's prediction keeps it, its permutation seeded by
    the epoch alone). `seed` (default: $PL_GLOBAL_SEED, else 0) must be the same on every rank, so
    that all ranks permute identically and their shards stay disjoint.
    """
    if isinstance(dataloader.dataset, IterableDataset):
        return dataloader
    batch_sampler_source = getattr(dataloader.batch_sampler, "sampler", None)
    if isinstance(dataloader.sampler, DistributedSampler) or isinstance(batch_sampler_source, DistributedSampler):
        return dataloader  # the user sharded it already
    _check_rebuildable(dataloader)
    own = dataloader.sampler
    shuffle = isinstance(own, RandomSampler) if shuffle is None else shuffle
    sampler: Sampler[Any]
    if keep_sampler or not isinstance(own, (RandomSampler, SequentialSampler)):
        _check_every_rank_has_a_draw(own, num_replicas, pad)
        sampler = SamplerShards(own, num_replicas, rank, shuffle=shuffle, pad=pad,
                                seed=0 if keep_sampler else _resolve_seed(seed))
    elif pad:
        _check_enough_samples_to_train(dataloader, num_replicas)
        sampler = ResumableDistributedSampler(dataloader.dataset, num_replicas=num_replicas,  # type: ignore[arg-type]
                                              rank=rank, shuffle=shuffle, seed=_resolve_seed(seed))
    else:
        _check_every_rank_has_a_batch(dataloader, num_replicas)
        sampler = ShardSampler(dataloader.dataset, num_replicas, rank,  # type: ignore[arg-type]
                               shuffle=shuffle, seed=_resolve_seed(seed))
    return rebuild_dataloader(dataloader, sampler)


def rebuild_dataloader(dataloader: DataLoader, sampler: Sampler[int]) -> DataLoader:
    """The same loader (batch size, workers, collate, ...) drawing its indices from `sampler`."""
    return DataLoader(dataloader.dataset, sampler=sampler, **_public_fields(dataloader))


def rebuild_with_batch_sampler(dataloader: DataLoader, batch_sampler: Any) -> DataLoader:
    """The same loader (workers, collate, ...) drawing whole batches of indices from `batch_sampler`."""
    fields = {key: value for key, value in _public_fields(dataloader).items() if key not in ("batch_size", "drop_last")}
    return DataLoader(dataloader.dataset, batch_sampler=batch_sampler, **fields)


def _check_enough_samples_to_train(dataloader: DataLoader, num_replicas: int) -> None:
    """Padding a dataset smaller than the world would train every rank on copies of the same
    samples: almost certainly a wrong path or split, so say so instead."""
    size = len(dataloader.dataset)  # type: ignore[arg-type]
    if size < num_replicas:
        raise ValueError(f"the training dataset has {size} sample(s) but there are {num_replicas} processes; "
                         "each process needs at least one sample of its own. Use fewer devices or more data.")


def _check_every_rank_has_a_batch(dataloader: DataLoader, num_replicas: int) -> None:
    """Unpadded shards may differ by one sample; that is harmless unless it decides whether a
    rank has any batch at all: a rank with none would skip the stage, and with it the epoch-end
    metric sync its peers wait in."""
    size = len(dataloader.dataset)  # type: ignore[arg-type]
    smallest, largest = size // num_replicas, -(-size // num_replicas)
    batch = dataloader.batch_size or 1
    if smallest == 0 and size > 0:
        raise ValueError(f"The evaluation DataLoader has {size} sample(s) but the job runs {num_replicas} "
                         f"processes: without padding some ranks would get no sample. Evaluate on at least "
                         f"{num_replicas} samples, on fewer processes, or pass use_distributed_sampler=False "
                         f"to the Trainer and shard the data yourself.")
    if dataloader.drop_last and (smallest // batch == 0) != (largest // batch == 0):
        raise ValueError(f"The evaluation DataLoader has drop_last=True and batch_size={batch}: its {size} "
                         f"samples split over {num_replicas} processes as {smallest}-{largest} per rank, so some "
                         f"ranks would have a batch and others none. Set drop_last=False for evaluation "
                         f"(every sample counted exactly once) or change batch_size.")


def _check_every_rank_has_a_draw(sampler: Any, num_replicas: int, pad: bool) -> None:
    """Unpadded shards of a sampler's draws: a rank with no draw would skip the stage, and with it the
    epoch-end sync its peers wait in (Lightning refuses such a split too)."""
    size = len(sampler) if isinstance(sampler, Sized) else None
    if not pad and size is not None and 0 < size < num_replicas:
        raise ValueError(f"The DataLoader's {type(sampler).__qualname__} draws {size} sample(s) but the job runs "
                         f"{num_replicas} processes: some ranks would get none. Draw at least {num_replicas}, run "
                         "fewer processes, or pass use_distributed_sampler=False to the Trainer and shard it yourself.")


def _check_rebuildable(dataloader: DataLoader) -> None:
    """Raise TypeError for a loader we cannot rebuild faithfully (a subclass, a custom batch sampler)."""
    if type(dataloader) is not DataLoader:
        raise TypeError(f"Cannot add a DistributedSampler to a {type(dataloader).__qualname__} (a DataLoader "
                        f"subclass): rebuilding it as a plain DataLoader would drop its behaviour; {_HINT}.")
    batch_sampler = dataloader.batch_sampler
    if batch_sampler is not None and (type(batch_sampler) is not BatchSampler
                                      or batch_sampler.sampler is not dataloader.sampler):
        raise TypeError(f"Cannot add a DistributedSampler to a DataLoader with a custom batch_sampler "
                        f"({type(batch_sampler).__qualname__}); {_HINT} (e.g. wrap a DistributedSampler "
                        f"in your batch sampler).")


def _public_fields(dataloader: DataLoader) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "batch_size": dataloader.batch_size,
        "num_workers": dataloader.num_workers,
        "collate_fn": dataloader.collate_fn,
        "pin_memory": dataloader.pin_memory,
        "drop_last": dataloader.drop_last,
        "timeout": dataloader.timeout,
        "worker_init_fn": dataloader.worker_init_fn,
        "multiprocessing_context": dataloader.multiprocessing_context,
        "generator": dataloader.generator,
        "prefetch_factor": dataloader.prefetch_factor,
        "persistent_workers": dataloader.persistent_workers,
        "pin_memory_device": dataloader.pin_memory_device,
    }
    if hasattr(dataloader, "in_order"):  # torch >= 2.6
        fields["in_order"] = dataloader.in_order
    return fields


def _resolve_seed(seed: int | None) -> int:
    if seed is not None:
        return seed
    raw = os.environ.get(SEED_VARIABLE, "0")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"Environment variable {SEED_VARIABLE}={raw!r} is not an integer; "
                         f"set it with seed_everything(<int>) or unset it.") from None
