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

An `IterableDataset` is returned unchanged: it has no indices to split, so the dataset itself
must shard (e.g. by `torch.distributed.get_rank()` inside `__iter__`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sized
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


def distribute_dataloader(dataloader: DataLoader, num_replicas: int, rank: int,
                          seed: int | None = None, pad: bool = True, shuffle: bool | None = None) -> DataLoader:
    """A DataLoader that yields only this rank's shard.

    `pad=True` (training) pads like DistributedSampler so every rank runs the same number of
    steps; `pad=False` (evaluation, prediction) covers each sample exactly once (`ShardSampler`).
    `shuffle` permutes the shards each epoch; None keeps the loader's own setting.
    `seed` (default: $PL_GLOBAL_SEED, else 0) must be the same on every rank, so that all
    ranks permute identically and their shards stay disjoint.
    """
    if isinstance(dataloader.dataset, IterableDataset):
        return dataloader
    batch_sampler_source = getattr(dataloader.batch_sampler, "sampler", None)
    if isinstance(dataloader.sampler, DistributedSampler) or isinstance(batch_sampler_source, DistributedSampler):
        return dataloader  # the user sharded it already
    own_shuffle = _check_rebuildable(dataloader)
    shuffle = own_shuffle if shuffle is None else shuffle
    sampler: Sampler[int]
    if pad:
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


def _check_rebuildable(dataloader: DataLoader) -> bool:
    """Raise TypeError for anything we cannot rebuild faithfully; return the shuffle setting."""
    if type(dataloader) is not DataLoader:
        raise TypeError(f"Cannot add a DistributedSampler to a {type(dataloader).__qualname__} (a DataLoader "
                        f"subclass): rebuilding it as a plain DataLoader would drop its behaviour; {_HINT}.")
    batch_sampler = dataloader.batch_sampler
    if batch_sampler is not None and (type(batch_sampler) is not BatchSampler
                                      or batch_sampler.sampler is not dataloader.sampler):
        raise TypeError(f"Cannot add a DistributedSampler to a DataLoader with a custom batch_sampler "
                        f"({type(batch_sampler).__qualname__}); {_HINT} (e.g. wrap a DistributedSampler "
                        f"in your batch sampler).")
    sampler = dataloader.sampler
    if type(sampler) is SequentialSampler:
        return False
    if type(sampler) is RandomSampler and not sampler.replacement \
            and sampler.num_samples == len(sampler.data_source):  # type: ignore[arg-type]
        return True
    raise TypeError(f"Cannot add a DistributedSampler to a DataLoader with a custom sampler "
                    f"({type(sampler).__qualname__}): its sampling order cannot be sharded automatically; "
                    f"{_HINT} (e.g. DistributedSampler, or your sampler restricted to this rank's indices).")


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
