"""Predicting on two processes with a prediction writer: each rank writes its own share with the
dataset indices of every sample, and the shares together cover the dataset exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy
from trainer import LightningModule, Trainer
from trainer.callbacks import BasePredictionWriter


class Doubler(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return batch[0] * 2


class RankFiles(BasePredictionWriter):
    def __init__(self, folder: Path, interval: str) -> None:
        super().__init__(interval)  # type: ignore[arg-type]
        self.folder = folder

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any,
                           batch_idx: int, dataloader_idx: int) -> None:
        torch.save((list(batch_indices), prediction), self.folder / f"rank{trainer.global_rank}_batch{batch_idx}.pt")

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        torch.save((batch_indices[0], predictions), self.folder / f"rank{trainer.global_rank}_epoch.pt")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("interval", ["batch", "epoch"])
def test_each_rank_writes_its_share_with_dataset_indices(tmp_path: Path, interval: str) -> None:
    values = torch.arange(11, dtype=torch.float32).unsqueeze(1) * 10  # an odd count: the shards differ by one
    data = DataLoader(TensorDataset(values), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(0))
    trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(), default_root_dir=tmp_path, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[RankFiles(tmp_path, interval)])
    trainer.predict(Doubler(), dataloaders=data, return_predictions=False)
    seen: list[int] = []
    for path in sorted(tmp_path.glob("rank*.pt")):
        indices, predictions = torch.load(path, weights_only=True)
        if interval == "epoch":
            indices, predictions = [i for batch in indices for i in batch], torch.cat(predictions)
        assert predictions.flatten().tolist() == [float(index * 20) for index in indices], path.name
        seen += indices
    assert {path.name[:5] for path in tmp_path.glob("rank*.pt")} == {"rank0", "rank1"}
    assert sorted(seen) == list(range(11))
