"""A Trainer built the way Hydra projects build it: `hydra.utils.instantiate(cfg.trainer, callbacks=...,
logger=...)`. Hydra hands the lists over as OmegaConf `ListConfig`s; Lightning's Trainer takes any iterable,
and so must ours. The same config and module under both Trainers (1 process), and ours on 2."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import ListConfig, OmegaConf
from torch.utils.data import DataLoader, TensorDataset

from trainer import LightningModule as OurModule


def _body(base: type) -> type:
    class Regressor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("train_loss", loss, on_step=True, on_epoch=False)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> DataLoader:
            generator = torch.Generator().manual_seed(0)
            x = torch.randn(32, 4, generator=generator)
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    return Regressor


def _counting(base: type) -> type:
    class Counting(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.batches = 0

        def on_train_batch_end(self, *args: Any) -> None:
            self.batches += 1

    return Counting


def _fit(trainer_target: str, module_base: type, callback_base: type, csv_logger: type, root: Path,
         devices: int) -> tuple[list[Any], list[dict[str, str]]]:
    cfg = OmegaConf.create({"trainer": {"_target_": trainer_target, "max_epochs": 2, "accelerator": "cpu",
                                        "devices": devices, "enable_progress_bar": False,
                                        "enable_model_summary": False, "enable_checkpointing": False,
                                        "log_every_n_steps": 1, "default_root_dir": str(root)}})
    callbacks = [_counting(callback_base)(), _counting(callback_base)()]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=[csv_logger(save_dir=str(root), name="run")])
    assert isinstance(trainer.callbacks, list) and len(trainer.loggers) == 1
    torch.manual_seed(0)
    trainer.fit(_body(module_base)())
    kept = [c for c in trainer.callbacks if type(c).__name__ == "Counting"]
    with open(next(root.rglob("metrics.csv"))) as handle:
        return [c.batches for c in kept], list(csv.DictReader(handle))


@pytest.mark.timeout(120)
def test_hydra_instantiated_trainers_take_listconfig_callbacks_and_logger(tmp_path: Path) -> None:
    from trainer.callbacks import Callback
    from trainer.loggers import CSVLogger

    passed = OmegaConf.create({"x": [1]})
    assert isinstance(passed.x, ListConfig)  # what Hydra merges a list argument into
    theirs = _fit("pytorch_lightning.Trainer", pl.LightningModule, pl.Callback, pl.loggers.CSVLogger,
                  tmp_path / "lightning", 1)
    ours = _fit("trainer.Trainer", OurModule, Callback, CSVLogger, tmp_path / "ours", 1)
    assert theirs[0] == ours[0] == [8, 8]
    assert [row["train_loss"] for row in ours[1]] == pytest.approx([row["train_loss"] for row in theirs[1]])
    two = _fit("trainer.Trainer", OurModule, Callback, CSVLogger, tmp_path / "ours2", 2)
    assert two[0] == [4, 4] and len(two[1]) == 4  # rank 0's counters, in the caller: 2 epochs x 2 batches
