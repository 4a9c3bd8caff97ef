"""Synthetic data: seeded, any size, generated in memory (benchmarks, smoke tests, scaling runs).

Classification labels come from a random two-layer "teacher" network, so a student MLP can
learn them well but not trivially; regression targets come from the same kind of teacher
plus Gaussian noise. `MLPRegressor` is the regression counterpart of `DigitsClassifier`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.datamodule import LightningDataModule
from trainer.demos.common import check_fraction, check_positive, configure_optimizer, make_loader, make_mlp
from trainer.module import LightningModule

TASKS = ("classification", "regression")


class SyntheticDataModule(LightningDataModule):
    """`num_samples` rows of `input_dim` standard-normal features; the data depend only on `seed`.

    Exposes `input_dim`, `num_classes` (None for regression) and `num_targets`, which
    `ddp-train` copies into a model config that leaves them null.
    """

    def __init__(self, task: str = "classification", num_samples: int = 4096, input_dim: int = 32,
                 num_classes: int = 4, num_targets: int = 1, noise: float = 0.1, val_fraction: float = 0.2,
                 batch_size: int = 64, seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task={task!r} is not one of {list(TASKS)}")
        for name, value in (("num_samples", num_samples), ("input_dim", input_dim), ("num_classes", num_classes),
                            ("num_targets", num_targets), ("batch_size", batch_size)):
            check_positive(name, value)
        check_positive("num_workers", num_workers, allow_zero=True)
        check_fraction("val_fraction", val_fraction)
        if num_samples * val_fraction < 1 or num_samples * (1 - val_fraction) < 1:
            raise ValueError(f"num_samples={num_samples} is too small for val_fraction={val_fraction}")
        self.task, self.num_samples, self.input_dim, self.noise = task, num_samples, input_dim, noise
        self.num_classes: int | None = num_classes if task == "classification" else None
        self.num_targets = num_targets
        self.val_fraction, self.batch_size, self.seed, self.num_workers = val_fraction, batch_size, seed, num_workers
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def generate(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All rows, deterministically from `seed` (independent of the global RNG state)."""
        gen = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.num_samples, self.input_dim, generator=gen)
        width = 2 * self.input_dim
        w1 = torch.randn(self.input_dim, width, generator=gen) / self.input_dim ** 0.5
        out_dim = self.num_classes if self.num_classes is not None else self.num_targets
        w2 = torch.randn(width, out_dim, generator=gen) / width ** 0.5
        signal = torch.tanh(x @ w1) @ w2
        noisy = signal + self.noise * torch.randn(signal.shape, generator=gen)
        if self.num_classes is not None:
            return x, noisy.argmax(dim=1)
        return x, noisy

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        x, y = self.generate()
        n_val = int(round(self.num_samples * self.val_fraction))
        self.train_set = TensorDataset(x[n_val:], y[n_val:])
        self.val_set = TensorDataset(x[:n_val], y[:n_val])

    def train_dataloader(self) -> DataLoader:
        return make_loader(self, self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return make_loader(self, self.val_set, shuffle=False)


class MLPRegressor(LightningModule):
    """An MLP trained with mean squared error; logs train_loss, val_loss (MSE) and val_mae."""

    def __init__(self, input_dim: int = 32, num_targets: int = 1, hidden_sizes: Sequence[int] = (128, 64),
                 dropout: float = 0.0, lr: float = 1e-3, optimizer: str = "adam", weight_decay: float = 0.0,
                 momentum: float = 0.9, scheduler: str | None = None) -> None:
        super().__init__()
        check_positive("input_dim", input_dim)
        check_positive("num_targets", num_targets)
        self.save_hyperparameters()
        self.net = make_mlp(input_dim, list(hidden_sizes), num_targets, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        prediction = self(x)
        self.log("val_loss", nn.functional.mse_loss(prediction, y), on_epoch=True, sync_dist=True, prog_bar=True)
        self.log("val_mae", nn.functional.l1_loss(prediction, y), on_epoch=True, sync_dist=True)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        return configure_optimizer(self, hp.optimizer, hp.lr, hp.weight_decay, hp.momentum, hp.scheduler)
