"""Subclass LightningModule, call Trainer.fit: the digits classifier on 2 processes with our DDP.

    python examples/train_digits.py

Each process gets half of every global batch (DistributedSampler); gradients are averaged
in buckets while backward runs, so both processes step identical weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy
from trainer import LightningDataModule, LightningModule, Trainer, seed_everything


class Digits(LightningDataModule):
    def setup(self, stage: str) -> None:
        from sklearn.datasets import load_digits  # ships with scikit-learn: nothing is downloaded

        images, labels = load_digits(return_X_y=True)
        x = torch.tensor(images, dtype=torch.float32) / 16.0
        y = torch.tensor(labels)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        split = int(0.8 * len(x))
        self.train_set = TensorDataset(x[order[:split]], y[order[:split]])
        self.val_set = TensorDataset(x[order[split:]], y[order[split:]])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=32, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=128)


class Classifier(LightningModule):
    def __init__(self, hidden: int = 128, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True, prog_bar=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


if __name__ == "__main__":  # required: each worker process re-imports this file
    seed_everything(42)
    model = Classifier()
    trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(bucket_cap_mb=25), max_epochs=8,
                      default_root_dir="outputs/examples")
    trainer.fit(model, datamodule=Digits())
    print(f"val_acc={float(trainer.callback_metrics['val_acc']):.3f}  "
          f"best checkpoint: {trainer.checkpoint_callback.best_model_path or '(none)'}")
