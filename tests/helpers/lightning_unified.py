"""A `lightning.pytorch` module and callback for the adapter tests.

Kept apart from the test module so that spawned workers unpickling them import only
`lightning.pytorch`, not pytest or `pytorch_lightning`.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as lp
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def regression_data(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [3.0], [0.5]]))


class UnifiedRegressor(lp.LightningModule):
    """A plain `lightning.pytorch` module: train/val steps that log, data from its own hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    @torch.no_grad()
    def mse(self, data: TensorDataset) -> float:
        x, y = data.tensors
        return float(nn.functional.mse_loss(self.layer(x), y))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(), batch_size=8)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(32), batch_size=8)


class RankDiffMetric(lp.Callback):
    """Puts the largest parameter difference from rank 0 into `callback_metrics["rank_diff"]`,
    which Lightning's spawn launcher returns to the launching process."""

    def on_train_end(self, trainer: lp.Trainer, pl_module: lp.LightningModule) -> None:
        worst = torch.zeros(())
        for param in pl_module.parameters():
            gathered = trainer.strategy.all_gather(param.detach())
            worst = torch.maximum(worst, (gathered - gathered[0]).abs().max())
        trainer.callback_metrics["rank_diff"] = worst
        trainer.callback_metrics["strategy_model"] = torch.tensor(
            float(type(trainer.strategy.model).__name__ == "ReducedModule"))
