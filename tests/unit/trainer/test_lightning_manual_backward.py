"""A module subclassing Lightning's LightningModule keeps its class's `manual_backward` on our Trainer:
a user's override runs (and its `super()` call reaches our Trainer's backward, hooks included), and
misuse raises Lightning's own exception, as under Lightning's Trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader

from tests.helpers.models import regression_data
from trainer import Trainer

_QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, max_epochs=1)


class DoublingBackward(pl.LightningModule):
    """Manual optimization whose manual_backward override doubles the loss and counts its calls."""

    def __init__(self, manual: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = not manual
        self.layer = nn.Linear(4, 1)
        self.calls = self.hook_calls = 0

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        super().manual_backward(loss * 2, *args, **kwargs)

    def on_after_backward(self) -> None:
        self.hook_calls += 1

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(trainer_class: Any, module: pl.LightningModule, root: Path) -> None:
    trainer_class(default_root_dir=str(root), **_QUIET).fit(module, DataLoader(regression_data(32), batch_size=8))


def test_an_overridden_manual_backward_runs_as_under_lightning(tmp_path: Path) -> None:
    ours, lightning = DoublingBackward(), DoublingBackward()
    _fit(Trainer, ours, tmp_path / "ours")
    _fit(pl.Trainer, lightning, tmp_path / "lightning")
    assert (ours.calls, ours.hook_calls) == (lightning.calls, lightning.hook_calls) == (4, 4)
    for mine, theirs in zip(ours.parameters(), lightning.parameters()):
        assert torch.equal(mine, theirs)
    assert "manual_backward" not in vars(ours)  # the stage's binding is taken back afterwards


def test_manual_backward_in_automatic_optimization_raises_lightnings_exception(tmp_path: Path) -> None:
    with pytest.raises(MisconfigurationException, match="disable automatic optimization"):
        _fit(Trainer, DoublingBackward(manual=False), tmp_path)
