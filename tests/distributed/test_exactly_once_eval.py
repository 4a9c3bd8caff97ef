"""Exactly-once evaluation and uneven training inputs at world size 2 (real gloo processes).

An odd-sized validation set (9 samples: shards of 5 and 4, so 3 and 2 batches) must give the
same `self.log` and torchmetrics values as one process on the same data, with no padded
duplicate counted and no rank left waiting on the other's extra batch. Values are small
integers, so every sum is exact and the comparison can be `==`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from torchmetrics import CatMetric, MeanMetric

from strategies.sampler import ShardSampler, distribute_dataloader
from trainer import LightningModule, Trainer

VALUES = torch.arange(1, 10)  # 9 samples, 1..9: mean 5, sum 45; a padded duplicate of `1` would show


class Counter(LightningModule):
    """Logs what a padded duplicate would change: a mean, a count, a sum, a max, torchmetrics."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.mean_metric = MeanMetric()
        self.seen = CatMetric()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        x = x.double()
        self.log("val_mean", x.mean(), sync_dist=True)
        self.log("val_count", float(len(x)), reduce_fx="sum", sync_dist=True)
        self.log("val_sum", x.sum(), reduce_fx="sum", sync_dist=True)
        self.log("val_max", x.max(), reduce_fx="max", sync_dist=True)
        self.log("val_step", x.mean(), on_step=True, on_epoch=False, sync_dist=True)  # deferred: no hang
        self.mean_metric.update(x)
        self.log("val_metric_mean", self.mean_metric)
        self.seen.update(x)

    def on_validation_epoch_end(self) -> None:
        seen = self.seen.compute()  # gathered from every rank (uneven sizes)
        self.log("val_seen", float(seen.numel()))
        self.log("val_seen_unique", float(seen.unique().numel()))
        self.seen.reset()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


EXPECTED = {"val_mean": 5.0, "val_count": 9.0, "val_sum": 45.0, "val_max": 9.0, "val_metric_mean": 5.0,
            "val_seen": 9.0, "val_seen_unique": 9.0}


def _trainer(tmp_path: Path, devices: int, **kwargs: Any) -> Trainer:
    return Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "single", logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=tmp_path, **kwargs)


@pytest.mark.timeout(120)
def test_odd_validation_set_equals_single_process(tmp_path: Path) -> None:
    loader = DataLoader(TensorDataset(VALUES), batch_size=2)
    with pytest.warns(UserWarning, match="this rank's own"):
        (single,) = _trainer(tmp_path, 1).validate(Counter(), loader)
    (ddp,) = _trainer(tmp_path, 2).validate(Counter(), loader)
    assert {k: single[k] for k in EXPECTED} == EXPECTED
    assert {k: ddp[k] for k in EXPECTED} == EXPECTED  # exact: no duplicate, no mean of rank means


class UnevenStream(IterableDataset):
    """Rank r yields 4 + 3r batches: cannot be padded, so ranks must agree when to stop."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        rank = dist.get_rank() if dist.is_initialized() else 0
        for step in range(4 + 3 * rank):
            yield torch.full((2, 1), float(step + 1))


class StepRecorder(Counter):
    """Checks inside the workers (where both ranks are visible) that they stopped together."""

    def on_train_end(self) -> None:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (self.trainer.global_step, [p.detach().clone() for p in self.parameters()]))
        steps = {step for step, _ in gathered}
        if steps != {4 * 2}:
            raise AssertionError(f"ranks stopped at different steps or not at the shortest rank: {steps}")
        for _, params in gathered[1:]:
            if any(not torch.equal(a, b) for a, b in zip(gathered[0][1], params)):
                raise AssertionError("parameters differ between ranks")


@pytest.mark.timeout(120)
@pytest.mark.conformance
def test_uneven_iterable_training_stops_together(tmp_path: Path) -> None:
    model = StepRecorder()
    trainer = _trainer(tmp_path, 2, max_epochs=2)
    trainer.fit(model, DataLoader(UnevenStream(), batch_size=None))
    assert trainer.global_step == 8  # 2 epochs x the shortest rank's 4 batches


# ---------------------------------------------------------------------- the sampler itself, in-process
@pytest.mark.parametrize(("size", "world"), [(9, 2), (10, 3), (7, 7), (1000, 8)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_cover_every_sample_exactly_once(size: int, world: int, shuffle: bool) -> None:
    dataset = TensorDataset(torch.arange(size))
    seen = []
    for rank in range(world):
        loader = distribute_dataloader(DataLoader(dataset, batch_size=3, shuffle=shuffle), world, rank, seed=1,
                                       pad=False)
        assert isinstance(loader.sampler, ShardSampler)
        loader.sampler.set_epoch(4)
        seen += [int(i) for (batch,) in loader for i in batch]
    assert sorted(seen) == list(range(size))


def test_training_keeps_padding() -> None:
    loader = distribute_dataloader(DataLoader(TensorDataset(VALUES), batch_size=2), 2, 1)
    assert [int(i) for (batch,) in loader for i in batch] == [2, 4, 6, 8, 1]  # padded to 5 with sample 0


@pytest.mark.parametrize(("size", "batch_size", "drop_last", "match"), [
    (1, 1, False, "1 sample.*2 processes"),
    (3, 2, True, "drop_last=True.*1-2 per rank"),
])
def test_a_rank_without_any_batch_is_refused(size: int, batch_size: int, drop_last: bool, match: str) -> None:
    loader = DataLoader(TensorDataset(torch.arange(size)), batch_size=batch_size, drop_last=drop_last)
    with pytest.raises(ValueError, match=match):
        distribute_dataloader(loader, 2, 0, pad=False)
