"""Give each rank its own shard of a DataLoader, explicitly.

We rebuild a plain `DataLoader` from its public fields with a `DistributedSampler` instead of
patching `DataLoader.__init__` to remember constructor arguments: a subclass or a custom
sampler has semantics we cannot reproduce, so we refuse it with a message saying what to do.

`DistributedSampler` pads the index list so every rank gets the same number of samples (and
therefore batches): uneven shards would leave one rank waiting in a collective forever.
Remember its docstring's warning: call `loader.sampler.set_epoch(epoch)` at the start of every
epoch (our fit loop does), or every epoch reuses the first epoch's order.

An `IterableDataset` is returned unchanged: it has no indices to split, so the dataset itself
must shard (e.g. by `torch.distributed.get_rank()` inside `__iter__`).
"""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler,
                              SequentialSampler)

SEED_VARIABLE = "PL_GLOBAL_SEED"
_HINT = "pass use_distributed_sampler=False to the Trainer and build the sampler yourself"


def distribute_dataloader(dataloader: DataLoader, num_replicas: int, rank: int,
                          seed: int | None = None) -> DataLoader:
    """A DataLoader that yields only this rank's shard, keeping the user's shuffle setting.

    `seed` (default: $PL_GLOBAL_SEED, else 0) must be the same on every rank, so that all
    ranks permute identically and their shards stay disjoint.
    """
    if isinstance(dataloader.dataset, IterableDataset):
        return dataloader
    batch_sampler_source = getattr(dataloader.batch_sampler, "sampler", None)
    if isinstance(dataloader.sampler, DistributedSampler) or isinstance(batch_sampler_source, DistributedSampler):
        return dataloader  # the user sharded it already
    shuffle = _check_rebuildable(dataloader)
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataloader.dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=_resolve_seed(seed),
        drop_last=False)
    return DataLoader(dataloader.dataset, sampler=sampler, **_public_fields(dataloader))


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
