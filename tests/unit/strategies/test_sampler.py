"""DistributedSampler injection: a faithful rebuild, or a TypeError that says what to do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler,
                              SequentialSampler, TensorDataset, WeightedRandomSampler)

from strategies.sampler import SEED_VARIABLE, distribute_dataloader

DATASET = TensorDataset(torch.arange(10.0))


def _collate(batch: list[Any]) -> Any:
    return batch


def _init_worker(worker_id: int) -> None:
    del worker_id


class Stream(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


class MyLoader(DataLoader):
    pass


def test_rebuild_keeps_every_public_field() -> None:
    generator = torch.Generator().manual_seed(3)
    original = DataLoader(DATASET, batch_size=3, shuffle=True, num_workers=2, collate_fn=_collate, pin_memory=False,
                          drop_last=True, timeout=5.0, worker_init_fn=_init_worker,
                          multiprocessing_context="spawn", generator=generator, prefetch_factor=4,
                          persistent_workers=True)
    loader = distribute_dataloader(original, num_replicas=2, rank=1)
    assert type(loader) is DataLoader and loader is not original
    for field in ("dataset", "batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout",
                  "worker_init_fn", "generator", "prefetch_factor", "persistent_workers", "pin_memory_device"):
        assert getattr(loader, field) == getattr(original, field), field
    assert loader.multiprocessing_context is original.multiprocessing_context
    sampler = loader.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle) == (2, 1, True)


def test_sequential_loader_stays_unshuffled_and_yields_this_ranks_shard() -> None:
    loader = distribute_dataloader(DataLoader(DATASET, batch_size=2), num_replicas=2, rank=0)
    assert isinstance(loader.sampler, DistributedSampler) and not loader.sampler.shuffle
    assert [batch[0].tolist() for batch in loader] == [[0.0, 2.0], [4.0, 6.0], [8.0]]


def test_shuffle_argument_overrides_the_loaders_own_order_as_lightnings_training_sampler_does() -> None:
    """The Trainer shuffles every training shard (Lightning's rule), whatever the loader says."""
    unshuffled = DataLoader(DATASET, batch_size=2, shuffle=False)
    ours = distribute_dataloader(unshuffled, num_replicas=2, rank=1, seed=3, shuffle=True)
    reference = DistributedSampler(DATASET, num_replicas=2, rank=1, shuffle=True, seed=3)  # type: ignore[arg-type]
    for epoch in (0, 1):
        ours.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        reference.set_epoch(epoch)
        assert list(ours.sampler) == list(reference)
    shuffled = distribute_dataloader(DataLoader(DATASET, shuffle=True), 2, 0, shuffle=False)
    assert list(shuffled.sampler) == [0, 2, 4, 6, 8]  # overfit_batches: in order


def test_seed_comes_from_the_argument_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    base = DataLoader(DATASET, shuffle=True)
    monkeypatch.delenv(SEED_VARIABLE, raising=False)
    assert distribute_dataloader(base, 2, 0).sampler.seed == 0  # type: ignore[attr-defined]
    monkeypatch.setenv(SEED_VARIABLE, "42")
    assert distribute_dataloader(base, 2, 0).sampler.seed == 42  # type: ignore[attr-defined]
    assert distribute_dataloader(base, 2, 0, seed=7).sampler.seed == 7  # type: ignore[attr-defined]
    monkeypatch.setenv(SEED_VARIABLE, "not-a-number")
    with pytest.raises(ValueError, match=SEED_VARIABLE):
        distribute_dataloader(base, 2, 0)


def test_existing_distributed_sampler_and_iterable_dataset_are_left_alone() -> None:
    already = DataLoader(DATASET, sampler=DistributedSampler(DATASET, num_replicas=2, rank=0))
    assert distribute_dataloader(already, 2, 1) is already
    batched = DataLoader(DATASET, batch_sampler=BatchSampler(DistributedSampler(DATASET, 2, 0), 2, False))
    assert distribute_dataloader(batched, 2, 1) is batched
    stream = DataLoader(Stream(), batch_size=2)
    assert distribute_dataloader(stream, 2, 1) is stream


def test_unbatched_loader_is_supported() -> None:
    loader = distribute_dataloader(DataLoader(DATASET, batch_size=None), num_replicas=2, rank=1)
    assert loader.batch_size is None
    assert [item[0].item() for item in loader] == [1.0, 3.0, 5.0, 7.0, 9.0]


@pytest.mark.parametrize(("loader", "found"), [
    (MyLoader(DATASET), "MyLoader"),
    (DataLoader(DATASET, sampler=iter(range(10))), "range_iterator"),  # no length: cannot be split
    (DataLoader(DATASET, batch_sampler=BatchSampler(SequentialSampler(DATASET), 2, False)), "BatchSampler"),
])
def test_unrebuildable_loaders_raise_type_error_with_the_fix(loader: DataLoader, found: str) -> None:
    with pytest.raises(TypeError, match=found) as info:
        distribute_dataloader(loader, num_replicas=2, rank=0)
    assert "use_distributed_sampler=False" in str(info.value)


def _draws(loader: DataLoader) -> list[int]:
    return [int(item) for batch in loader for item in batch[0]]


def _lightning_split(make: Any, sampler: Any, world: int, **kwargs: Any) -> list[list[int]]:
    """What Lightning's wrapper hands each rank, each rank drawing from the same generator state."""
    shards = []
    for rank in range(world):
        torch.manual_seed(11)
        shards.append([int(index) for index in make(sampler, num_replicas=world, rank=rank, **kwargs)])
    return shards


def _our_split(loader: DataLoader, world: int, **kwargs: Any) -> list[list[int]]:
    shards = []
    for rank in range(world):
        torch.manual_seed(11)
        shards.append(list(distribute_dataloader(loader, world, rank, **kwargs).sampler))
    return shards


@pytest.mark.parametrize("world", [2, 3])
def test_a_weighted_sampler_is_split_as_lightnings_wrapper_splits_it(world: int) -> None:
    """Training keeps the loader's own sampler and pads its draws (Lightning's DistributedSamplerWrapper);
    evaluation takes every draw exactly once (our rule), in the same order."""
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    weighted = WeightedRandomSampler(torch.linspace(0.1, 1.0, 10), num_samples=10)
    loader = DataLoader(DATASET, batch_size=2, sampler=weighted)
    lightning = _lightning_split(DistributedSamplerWrapper, weighted, world, shuffle=True, seed=4)
    assert _our_split(loader, world, seed=4, shuffle=True) == lightning
    unpadded = _our_split(loader, world, seed=4, pad=False, shuffle=False)
    lightning_in_order = _lightning_split(DistributedSamplerWrapper, weighted, world, shuffle=False)
    assert unpadded == [shard[:len(range(rank, 10, world))] for rank, shard in enumerate(lightning_in_order)]
    assert sorted(sum(unpadded, [])) == sorted(sum((s[:len(range(r, 10, world))] for r, s in
                                                    enumerate(lightning_in_order)), []))


@pytest.mark.parametrize("shuffle", [True, False])
def test_prediction_keeps_the_loaders_sampler_as_lightning_does(shuffle: bool) -> None:
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSamplerWrapper

    loader = DataLoader(DATASET, batch_size=3, shuffle=shuffle)
    lightning = _lightning_split(UnrepeatedDistributedSamplerWrapper, loader.sampler, 2, shuffle=shuffle, seed=9)
    ours = _our_split(loader, 2, seed=9, pad=False, keep_sampler=True)
    assert ours == lightning and sorted(ours[0] + ours[1]) == list(range(10))
    torch.manual_seed(11)
    before = torch.random.get_rng_state()
    list(distribute_dataloader(loader, 2, 0, keep_sampler=True).sampler)
    # a shuffling loader's RandomSampler drew its seed from torch's generator, as under Lightning
    assert torch.equal(before, torch.random.get_rng_state()) is not shuffle


def test_a_sampler_epoch_reaches_the_sampler_inside() -> None:
    class EpochAware(SequentialSampler):
        epoch = -1

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    inner = EpochAware(DATASET)
    loader = distribute_dataloader(DataLoader(DATASET, sampler=inner), 2, 0, keep_sampler=True)
    loader.sampler.set_epoch(3)  # type: ignore[attr-defined]
    assert inner.epoch == 3
