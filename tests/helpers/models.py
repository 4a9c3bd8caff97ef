"""Tiny deterministic modules and data for trainer tests (importable by spawned workers)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from trainer import LightningDataModule, LightningModule


def ddp_training_order(dataset: Dataset) -> DistributedSampler:
    """The order in which a DDP run's training shards, taken together, visit the samples: the shuffled
    DistributedSampler's global permutation (Lightning's rule and ours), seeded by the global seed and
    reshuffled each epoch. One process drawing in this order trains on the same global batches."""
    return DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True,  # type: ignore[arg-type]
                              seed=int(os.environ.get("PL_GLOBAL_SEED", 0)))


def regression_data(n: int = 64, features: int = 4, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    w = torch.arange(1, features + 1, dtype=torch.float32)
    y = (x @ w).unsqueeze(1) + 0.01 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


class TinyRegressor(LightningModule):
    """Linear regression; logs train_loss per step and val_loss per epoch."""

    def __init__(self, features: int = 4, lr: float = 0.05, optimizer: str = "sgd") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        if self.hparams.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class RegressionData(LightningDataModule):
    """`global_order=True`: the training samples in a DDP run's global order (`ddp_training_order`), for
    the one-process reference of a DDP run."""

    def __init__(self, n: int = 64, batch_size: int = 8, shuffle: bool = False, global_order: bool = False) -> None:
        super().__init__()
        self.n, self.batch_size, self.shuffle, self.global_order = n, batch_size, shuffle, global_order

    def setup(self, stage: str) -> None:
        self.train_set = regression_data(self.n, seed=0)
        self.val_set = regression_data(self.n // 2, seed=1)

    def train_dataloader(self) -> DataLoader:
        if self.global_order:
            return DataLoader(self.train_set, batch_size=self.batch_size, sampler=ddp_training_order(self.train_set))
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=self.shuffle)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)


class DropoutRegressor(TinyRegressor):
    """Randomness inside the step (dropout) makes every rank's RNG stream matter on resume."""

    def __init__(self, features: int = 4, lr: float = 0.05, optimizer: str = "adam") -> None:
        super().__init__(features, lr, optimizer)
        self.hidden = nn.Sequential(nn.Linear(features, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hidden(x)


class CrashOnceRegressor(TinyRegressor):
    """Rank 1 dies at `crash_step` in the first attempt only (torch elastic counts restarts)."""

    def __init__(self, crash_step: int = 5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_step = crash_step

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        import os

        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and self.global_rank == 1 and self.global_step == self.crash_step:
            raise RuntimeError("injected failure")
        return super().training_step(batch, batch_idx)


class RankLocalDrift(TinyRegressor):
    """A rank-dependent bug: rank 1 nudges a parameter after its optimizer step."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_rank == 1 and self.global_step == 3:
            with torch.no_grad():
                self.layer.bias.add_(1e-3)


class SyncOnOneRank(TinyRegressor):
    """A rank-dependent bug: in one step only rank 0 logs a value with `sync_dist=True`."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.global_rank == 0 and batch_idx == 2:
            self.log("rank0_only", loss, sync_dist=True)
        return loss


class StallOnOneRank(TinyRegressor):
    """Rank 1 stops calling collectives in step 2 (stuck in its own code) while rank 0 goes on."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == 1 and batch_idx == 2:
            time.sleep(120)
        return super().training_step(batch, batch_idx)


class IndexData(LightningDataModule):
    """Sample i is the number i (one feature): a model can tell exactly which samples it saw."""

    def __init__(self, n: int = 40, batch_size: int = 4) -> None:
        super().__init__()
        self.n, self.batch_size = n, batch_size

    def setup(self, stage: str) -> None:
        x = torch.arange(self.n, dtype=torch.float32).unsqueeze(1)
        self.train_set = TensorDataset(x, 2 * x)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)


class SampleRecorder(TinyRegressor):
    """Writes the sample indices each rank trained on, per (epoch, batch), to `out_dir/<tag>_rank<r>.json`."""

    def __init__(self, out_dir: str, tag: str) -> None:
        super().__init__(features=1, lr=1e-3)
        self.out_dir, self.tag = out_dir, tag
        self.seen: list[tuple[int, int, list[int]]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch_idx, batch[0].flatten().long().tolist()))
        return super().training_step(batch, batch_idx)

    def on_train_end(self) -> None:
        import json
        from pathlib import Path

        Path(self.out_dir, f"{self.tag}_rank{self.global_rank}.json").write_text(json.dumps(self.seen))


class SlowPrepareData(RegressionData):
    """`prepare_data` (local rank 0 only) takes longer than a short stall_timeout, like a download."""

    def prepare_data(self) -> None:
        time.sleep(5.0)
