"""Prediction writers with Lightning's Trainer as the oracle: Lightning's own `BasePredictionWriter`
subclass, unchanged, and ours of the same name, see the same predictions and dataset indices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from trainer import Trainer
from trainer.callbacks import BasePredictionWriter


def _predict(trainer_class: Any, writer_base: type, interval: str, root: Path,
             return_predictions: bool, iterable: bool = False) -> tuple[dict[str, Any], Any]:
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset, RandomIterableDataset

    written: dict[str, Any] = {"batches": [], "epoch": None}

    class Writer(writer_base):  # type: ignore[misc, valid-type]
        def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any,
                               batch_idx: int, dataloader_idx: int) -> None:
            written["batches"].append((list(batch_indices), batch_idx, dataloader_idx, prediction.shape))

        def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
            written["epoch"] = ([p.shape for p in predictions], batch_indices)

    data = (DataLoader(RandomIterableDataset(32, 10), batch_size=4) if iterable else
            DataLoader(RandomDataset(32, 10), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)))
    trainer = trainer_class(default_root_dir=root, accelerator="cpu", devices=1, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, callbacks=[Writer(interval)])
    returned = trainer.predict(BoringModel(), dataloaders=data, return_predictions=return_predictions)
    return written, None if returned is None else [p.shape for p in returned]


@pytest.mark.parametrize("interval", ["batch", "epoch", "batch_and_epoch"])
@pytest.mark.parametrize("return_predictions", [True, False])
def test_writers_see_what_they_see_under_lightning(tmp_path: Path, interval: str, return_predictions: bool) -> None:
    import pytorch_lightning as pl

    theirs = _predict(pl.Trainer, pl.callbacks.BasePredictionWriter, interval, tmp_path / "pl", return_predictions)
    with_theirs = _predict(Trainer, pl.callbacks.BasePredictionWriter, interval, tmp_path / "a", return_predictions)
    with_ours = _predict(Trainer, BasePredictionWriter, interval, tmp_path / "b", return_predictions)
    assert with_theirs == theirs and with_ours == theirs
    indices = sorted(i for batch in (theirs[0]["epoch"][1][0] if theirs[0]["epoch"] else
                                     [b[0] for b in theirs[0]["batches"]]) for i in batch)
    assert indices == list(range(10))  # shuffled, each sample once


@pytest.mark.parametrize("interval", ["batch", "epoch"])
def test_writers_of_an_iterable_dataset_get_no_indices_as_under_lightning(tmp_path: Path, interval: str) -> None:
    """An iterable dataset's loader has no index sampler (it refuses a batch sampler): the writers get
    empty indices for each batch, and the prediction runs."""
    import pytorch_lightning as pl

    theirs = _predict(pl.Trainer, pl.callbacks.BasePredictionWriter, interval, tmp_path / "pl", True, iterable=True)
    ours = _predict(Trainer, BasePredictionWriter, interval, tmp_path / "ours", True, iterable=True)
    assert ours == theirs
    assert len(theirs[1]) == 3  # 10 samples in batches of 4


def test_an_unknown_interval_is_named() -> None:
    with pytest.raises(ValueError, match="write_interval='step'"):
        BasePredictionWriter("step")  # type: ignore[arg-type]
