"""Resuming a fit whose callback changed the optimizer: Lightning's `BaseFinetuning` unfreezes a backbone
by adding a parameter group, and on resume adds it back in `on_fit_start`, before the saved optimizer
state (two groups) is loaded. Lightning restores the optimizers, schedulers and loop position after
`on_fit_start`; so do we, so the resumed fit trains to the same weights as under Lightning's Trainer
(and `on_fit_start` sees step 0, as there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.callbacks import BaseFinetuning, ModelCheckpoint  # noqa: E402
from pytorch_lightning.demos.boring_classes import BoringModel  # noqa: E402

from trainer import Trainer  # noqa: E402


class UnfreezeAtStart(BaseFinetuning):
    """Trains the head alone, and from epoch 0 the backbone too, in a second group with its own lr."""

    def freeze_before_training(self, pl_module: Any) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        if epoch == 0:
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr=0.01, train_bn=True)


class WithBackbone(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(32, 32)
        self.layer = nn.Linear(32, 2)
        self.seen_at_fit_start: list[tuple[int, int, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.backbone(x))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.1, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]

    def on_fit_start(self) -> None:
        trainer = self.trainer
        self.seen_at_fit_start.append((trainer.global_step, trainer.current_epoch,
                                       len(trainer.optimizers[0].param_groups)))


def _run(trainer_class: type, root: Path) -> tuple[Any, ...]:
    def fit(epochs: int, ckpt_path: str | None) -> tuple[WithBackbone, Any]:
        torch.manual_seed(0)
        model = WithBackbone()
        trainer = trainer_class(default_root_dir=root, max_epochs=epochs, limit_train_batches=2, limit_val_batches=1,
                                num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                                enable_model_summary=False,
                                callbacks=[ModelCheckpoint(dirpath=root, save_last=True), UnfreezeAtStart()])
        trainer.fit(model, ckpt_path=ckpt_path)
        return model, trainer

    fit(2, None)
    model, trainer = fit(3, str(root / "last.ckpt"))
    optimizer = trainer.optimizers[0]
    return (model.seen_at_fit_start, [group["lr"] for group in optimizer.param_groups], trainer.global_step,
            [p.detach().clone() for p in model.parameters()])


def test_resuming_a_finetuning_run_matches_lightning(tmp_path: Path) -> None:
    *ours, our_weights = _run(Trainer, tmp_path / "ours")
    *lightning, lightning_weights = _run(pl.Trainer, tmp_path / "pl")
    assert ours == lightning
    assert lightning[0] == [(0, 0, 2)] and len(lightning[1]) == 2  # the oracle: step 0, the group already back
    assert all(torch.equal(a, b) for a, b in zip(our_weights, lightning_weights))
