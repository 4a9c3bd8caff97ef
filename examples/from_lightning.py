"""An unchanged pytorch_lightning.LightningModule, trained by our Trainer: only the import moves.

    python examples/from_lightning.py

Before:  from pytorch_lightning import Trainer
After:   from trainer import Trainer
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer  # the only line that changed


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return {"loss": loss}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_data(512, seed=0), batch_size=32, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_data(128, seed=1), batch_size=64)


def _data(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


if __name__ == "__main__":
    pl.seed_everything(0)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=5, logger=False,
                      enable_checkpointing=False)
    model = Regressor()
    trainer.fit(model)
    print(f"val_loss={float(trainer.callback_metrics['val_loss']):.4f}")
