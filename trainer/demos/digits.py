"""Digits: scikit-learn's bundled 8x8 handwritten digits, a small MLP or CNN classifier.

The default `ddp-train` job. The data ship inside scikit-learn (1,797 images, no download),
so the demo runs anywhere and reaches ~97% validation accuracy in seconds on a laptop CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.datamodule import LightningDataModule
from trainer.demos.common import check_fraction, check_positive, configure_optimizer, make_loader, make_mlp
from trainer.module import LightningModule


@functools.lru_cache(maxsize=1)
def _bundled_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 images and labels, read once per process (~30 ms a read: the csv is parsed each time):
    a multirun's later jobs, the next Trainer of a script and ranks forked after the first read reuse
    them. Nothing writes to them: `setup` indexes (copies) them before anything else."""
    from sklearn.datasets import load_digits  # imported here: scikit-learn costs ~1 s to import

    images, labels = load_digits(return_X_y=True)
    return torch.as_tensor(images, dtype=torch.float32), torch.as_tensor(labels, dtype=torch.long)


class DigitsDataModule(LightningDataModule):
    """Standardised 64-feature float tensors with a fixed, seeded train/val split.

    The split depends only on `seed` (not on the global seed), so every rank and every rerun
    sees the same validation set; statistics come from the training part only.
    """

    input_dim = 64
    num_classes = 10

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        check_positive("batch_size", batch_size)
        check_fraction("val_fraction", val_fraction)
        check_positive("num_workers", num_workers, allow_zero=True)
        self.batch_size, self.val_fraction, self.seed, self.num_workers = batch_size, val_fraction, seed, num_workers
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        features, targets = _bundled_digits()
        order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(self.seed))
        n_val = max(1, int(round(len(order) * self.val_fraction)))
        train_idx, val_idx = order[n_val:], order[:n_val]
        mean = features[train_idx].mean(dim=0)
        # Floor of one grey level (of 16): some border pixels are almost always 0 in the training
        # part, and dividing by their tiny std would turn one stray validation pixel into 1e4.
        std = features[train_idx].std(dim=0).clamp_min(1.0)
        features = (features - mean) / std
        self.train_set = TensorDataset(features[train_idx], targets[train_idx])
        self.val_set = TensorDataset(features[val_idx], targets[val_idx])

    def train_dataloader(self) -> DataLoader:
        return make_loader(self, self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return make_loader(self, self.val_set, shuffle=False)


class DigitsClassifier(LightningModule):
    """An MLP (`arch="mlp"`) or a small CNN (`arch="cnn"`) over flattened square images.

    `input_dim`/`num_classes` default to the digits data; `ddp-train` fills them from the
    datamodule when the config leaves them null, so the same class trains on synthetic data.
    """

    ARCHS = ("mlp", "cnn")

    def __init__(self, arch: str = "mlp", input_dim: int = 64, num_classes: int = 10,
                 hidden_sizes: Sequence[int] = (256,), channels: Sequence[int] = (16, 32),
                 dropout: float = 0.0, lr: float = 3e-3, optimizer: str = "adam", weight_decay: float = 0.0,
                 momentum: float = 0.9, scheduler: str | None = None) -> None:
        super().__init__()
        if arch not in self.ARCHS:
            raise ValueError(f"arch={arch!r} is not one of {list(self.ARCHS)}")
        check_positive("input_dim", input_dim)
        check_positive("num_classes", num_classes)
        self.save_hyperparameters()
        if arch == "mlp":
            self.net = make_mlp(input_dim, list(hidden_sizes), num_classes, dropout)
        else:
            self.net = make_cnn(input_dim, list(channels), num_classes, dropout)
        from torchmetrics.classification import MulticlassAccuracy  # heavy import, needed only here

        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), on_step=False, on_epoch=True,
                 sync_dist=True, prog_bar=True)
        self.log("val_acc", self.val_acc, on_step=False, on_epoch=True, sync_dist=True, prog_bar=True)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        return configure_optimizer(self, hp.optimizer, hp.lr, hp.weight_decay, hp.momentum, hp.scheduler)


def make_cnn(input_dim: int, channels: list[int], num_classes: int, dropout: float) -> nn.Sequential:
    """Conv blocks (3x3, ReLU) then one 2x2 pool and a linear head; input is a flat square image."""
    side = int(round(input_dim ** 0.5))
    if side * side != input_dim:
        raise ValueError(f"arch='cnn' needs a square image: input_dim={input_dim} is not a perfect square")
    layers: list[nn.Module] = [nn.Unflatten(1, (1, side, side))]
    in_channels = 1
    for out_channels in channels:
        layers += [nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1), nn.ReLU()]
        in_channels = out_channels
    layers += [nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(dropout),
               nn.Linear(in_channels * (side // 2) ** 2, num_classes)]
    return nn.Sequential(*layers)
