"""Pieces the demo modules share: argument checks, an MLP builder, optimizer/scheduler choice."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULERS = (None, "cosine", "step")


def check_positive(name: str, value: Any, allow_zero: bool = False) -> None:
    """Constructor-argument check; the CLI turns the ValueError into a one-line config error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name}={value!r} must be {'>= 0' if allow_zero else '>= 1'}")


def check_fraction(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name}={value!r} must be a fraction strictly between 0 and 1")


def make_mlp(input_dim: int, hidden_sizes: list[int], output_dim: int, dropout: float = 0.0) -> nn.Sequential:
    """Linear-ReLU(-Dropout) blocks and a linear head."""
    layers: list[nn.Module] = []
    width = input_dim
    for hidden in hidden_sizes:
        check_positive("hidden_sizes[*]", hidden)
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = hidden
    layers.append(nn.Linear(width, output_dim))
    return nn.Sequential(*layers)


def configure_optimizer(module: nn.Module, name: str, lr: float, weight_decay: float = 0.0,
                        momentum: float = 0.9, scheduler: str | None = None) -> Any:
    """Return `configure_optimizers`' value: an optimizer, or Lightning's dict with a scheduler.

    "cosine" anneals to zero over `trainer.max_epochs` (100 epochs when training is
    unbounded); "step" halves the learning rate every 10 epochs.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer={name!r} is not one of {list(OPTIMIZERS)}")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler={scheduler!r} is not one of {list(SCHEDULERS)}")
    params = module.parameters()
    optimizer: torch.optim.Optimizer
    if name == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    elif name == "adamw":
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    else:
        optimizer = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if scheduler is None:
        return optimizer
    if scheduler == "cosine":
        max_epochs = _trainer_max_epochs(module)
        epochs = max_epochs if isinstance(max_epochs, int) and max_epochs > 0 else 100
        lr_scheduler: Any = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    else:
        lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "interval": "epoch"}}


def _trainer_max_epochs(module: nn.Module) -> Any:
    try:
        return module.trainer.max_epochs  # type: ignore[union-attr]
    except (AttributeError, RuntimeError):  # not attached to a Trainer (a manual loop, a test)
        return None


def make_loader(owner: Any, dataset: Dataset | None, shuffle: bool) -> DataLoader:
    """A loader with the datamodule's batch size and workers; a clear error before `setup()`."""
    if dataset is None:
        raise RuntimeError(f"{type(owner).__name__}.setup() must run before asking for a dataloader.")
    return DataLoader(dataset, batch_size=owner.batch_size, shuffle=shuffle, num_workers=owner.num_workers,
                      persistent_workers=owner.num_workers > 0)
