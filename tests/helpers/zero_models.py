"""Modules for the ZeRO parity tests (importable by the workers): parameters of odd sizes, so even shards cut
through them and buckets need padding; two param groups; a frozen and an unused parameter; the optimizer,
scheduler and manual optimization chosen by hyperparameters."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import LightningModule


def zero_data(n: int = 96, features: int = 7, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=8)


class ZeroNet(LightningModule):
    """An MLP with 7 -> 13 -> 11 -> 1 layers, a frozen embedding-like layer and a parameter no loss uses."""

    def __init__(self, optimizer: str = "adamw", scheduler: bool = False, manual: bool = False,
                 lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.frozen = nn.Linear(7, 7)
        self.frozen.requires_grad_(False)
        self.first = nn.Linear(7, 13)
        self.second = nn.Linear(13, 11)
        self.head = nn.Linear(11, 1)
        self.unused = nn.Parameter(torch.randn(5))
        self.automatic_optimization = not manual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.first(self.frozen(x)))
        return self.head(torch.tanh(self.second(x)))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        if not self.hparams.manual:
            return loss
        first, second = self.optimizers()
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        second.step()
        return loss

    def configure_optimizers(self) -> Any:
        decay = [p for name, p in self.named_parameters() if name.endswith("weight")]
        no_decay = [p for name, p in self.named_parameters() if not name.endswith("weight")]
        kind, lr = self.hparams.optimizer, self.hparams.lr
        if self.hparams.manual:
            return [torch.optim.AdamW(decay, lr=lr, weight_decay=0.1), torch.optim.SGD(no_decay, lr=lr, momentum=0.9)]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0, "lr": lr / 2}]
        if kind == "sgd":
            optimizer: torch.optim.Optimizer = torch.optim.SGD(groups, lr=lr, momentum=0.9)
        elif kind == "adam":
            optimizer = torch.optim.Adam(groups, lr=lr, betas=(0.8, 0.99))
        elif kind == "adamw":
            optimizer = torch.optim.AdamW(groups, lr=lr)
        elif kind == "lbfgs":
            optimizer = torch.optim.LBFGS(self.parameters(), lr=lr)
        else:
            raise ValueError(kind)
        if not self.hparams.scheduler:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
