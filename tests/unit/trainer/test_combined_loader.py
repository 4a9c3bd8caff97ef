"""Several dataloaders in one stage, against Lightning's Trainer on the same module and data.

Training on a collection of loaders (Lightning wraps it in `max_size_cycle`), a Lightning
`CombinedLoader` in each mode for training and evaluation, and our own `CombinedLoader`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402
from lightning.pytorch.utilities import CombinedLoader as LightningCombinedLoader  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.combined_loader import CombinedLoader  # noqa: E402


def _loader(start: int, size: int, batch_size: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(start, start + size, dtype=torch.float32)), batch_size=batch_size)


def _plain(batch: Any) -> Any:
    """A batch as nested Python lists/dicts of ints (to compare across Trainers)."""
    if isinstance(batch, torch.Tensor):
        return batch.int().tolist()
    if isinstance(batch, dict):
        return {key: _plain(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_plain(value) for value in batch]
    return batch


class _Recorder(BoringModel):
    """Records every batch a step receives; trains a scalar weight on the first member's data."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, Any, int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen.append(("train", _plain(batch), batch_idx))
        return self.layer.weight.sum() * 0.0 + self.layer.bias.sum()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.seen.append(("val", _plain(batch), dataloader_idx))

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.seen.append(("test", _plain(batch), dataloader_idx))


def _trainer(trainer_class: type, tmp_path: Path, **kwargs: Any) -> Any:
    return trainer_class(default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kwargs)


def _train_loaders(kind: str) -> Any:
    members = {"a": _loader(0, 6, 2), "b": _loader(100, 3, 2)}
    if kind == "dict":
        return members
    if kind == "list":
        return list(members.values())
    if kind.startswith("nested"):  # loaders inside lists inside a dict: every one is a member
        nested = {"ab": list(members.values()), "c": _loader(200, 4, 2)}
        return nested if kind == "nested" else LightningCombinedLoader(nested, kind.split("-")[1])
    return LightningCombinedLoader(members, kind)


@pytest.mark.parametrize("kind", ["dict", "list", "max_size_cycle", "min_size", "max_size", "nested",
                                  "nested-min_size", "nested-max_size"])
def test_training_on_several_loaders_sees_lightnings_batches(tmp_path: Path, kind: str) -> None:
    runs = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        model = _Recorder()
        trainer = _trainer(trainer_class, tmp_path / name, max_epochs=2, limit_val_batches=0)
        trainer.fit(model, train_dataloaders=_train_loaders(kind))
        runs[name] = (model.seen, trainer.num_training_batches, trainer.global_step)
    assert runs["ours"] == runs["lightning"]
    assert runs["ours"][0]  # something was trained on


@pytest.mark.parametrize("mode", ["max_size_cycle", "min_size", "max_size", "sequential"])
@pytest.mark.parametrize("stage", ["validate", "test"])
def test_evaluating_a_combined_loader_matches_lightning(tmp_path: Path, mode: str, stage: str) -> None:
    runs = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        model = _Recorder()
        trainer = _trainer(trainer_class, tmp_path / name)
        loaders = LightningCombinedLoader({"a": _loader(0, 6, 2), "b": _loader(100, 3, 2)}, mode)
        getattr(trainer, stage)(model, loaders, verbose=False)
        counts = trainer.num_val_batches if stage == "validate" else trainer.num_test_batches
        runs[name] = (model.seen, list(counts))
    assert runs["ours"] == runs["lightning"]


def test_our_combined_loader_modes() -> None:
    members = {"a": [0, 1, 2], "b": {3, 4}}  # a list (or set) of plain values is one member, as in Lightning
    assert list(CombinedLoader(members, "max_size_cycle")) == [{"a": 0, "b": 3}, {"a": 1, "b": 4}, {"a": 2, "b": 3}]
    assert list(CombinedLoader(members, "min_size")) == [{"a": 0, "b": 3}, {"a": 1, "b": 4}]
    assert list(CombinedLoader(members, "max_size")) == [{"a": 0, "b": 3}, {"a": 1, "b": 4}, {"a": 2, "b": None}]
    assert list(CombinedLoader(members, "sequential")) == [(0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 0, 1), (4, 1, 1)]
    assert [len(CombinedLoader(members, mode)) for mode in ("max_size_cycle", "min_size", "max_size", "sequential")] \
        == [3, 2, 3, 5]
    with pytest.raises(ValueError, match="mode 'zip'"):
        CombinedLoader(members, "zip")
    nested = CombinedLoader({"a": [range(2), [10, 11, 12]], "b": range(20, 22)}, "max_size")
    assert len(nested.flattened) == 3 and len(nested) == 3
    assert list(nested) == [{"a": [0, 10], "b": 20}, {"a": [1, 11], "b": 21}, {"a": [None, 12], "b": None}]


def test_sequential_training_is_refused_with_the_modes_to_use(tmp_path: Path) -> None:
    trainer = _trainer(Trainer, tmp_path, max_epochs=1)
    with pytest.raises(ValueError, match="mode='sequential'.*max_size_cycle"):
        trainer.fit(_Recorder(), train_dataloaders=CombinedLoader([_loader(0, 4, 2)], "sequential"))
