"""Our ModelCheckpoint and LearningRateMonitor against Lightning's, each in its own Trainer.

The same module and settings run under `pytorch_lightning`'s Trainer with Lightning's callback
and under ours with ours; the files written (names, which epoch `last.ckpt` holds) and the
learning-rate series must be equal.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch import callbacks as lightning_callbacks  # noqa: E402
from lightning.pytorch.callbacks import BackboneFinetuning  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer import callbacks as our_callbacks  # noqa: E402
from trainer.loggers import CSVLogger  # noqa: E402

_SIDES = {"lightning": (pl.Trainer, lightning_callbacks), "ours": (Trainer, our_callbacks)}


class _ValLoss(BoringModel):
    """Logs `val_loss` from a fixed per-epoch list, so which epochs are best is known."""

    losses = [3.0, 2.0, 4.0, 1.0]

    def on_validation_epoch_end(self) -> None:
        self.log("val_loss", self.losses[self.current_epoch])


def _files_and_last_epoch(directory: Path, callback: Any) -> tuple[list[str], int | None]:
    names = sorted(os.listdir(directory)) if directory.exists() else []
    last = torch.load(callback.last_model_path, weights_only=False)["epoch"] if callback.last_model_path else None
    return names, last


def _run(side: str, tmp_path: Path, module: Any, checkpoint_kwargs: dict[str, Any], ckpt_path: str | None = None,
         **trainer_kwargs: Any) -> tuple[list[str], int | None]:
    trainer_class, callbacks = _SIDES[side]
    directory = tmp_path / side
    callback = callbacks.ModelCheckpoint(dirpath=directory, **checkpoint_kwargs)
    kwargs = dict(default_root_dir=tmp_path / f"{side}-root", max_epochs=4, limit_train_batches=2,
                  limit_val_batches=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer = trainer_class(callbacks=[callback], **{**kwargs, **trainer_kwargs})
    trainer.fit(module, ckpt_path=ckpt_path)
    return _files_and_last_epoch(directory, callback)


@pytest.mark.parametrize("checkpoint_kwargs, trainer_kwargs", [
    ({"monitor": "val_loss", "save_last": True}, {}),                         # last follows top-k saves only
    ({"save_top_k": 0, "save_last": True, "every_n_epochs": 5}, {"limit_val_batches": 0}),  # last at train end
    ({"save_last": True, "save_on_train_epoch_end": False}, {"limit_val_batches": 0}),      # no validation at all
    ({"monitor": "val_loss", "every_n_train_steps": 3, "save_top_k": -1}, {}),  # waits for the validation metric
    ({"monitor": "val_loss", "save_top_k": 2, "save_last": "link"}, {}),
], ids=["last-after-top-k", "last-at-train-end", "last-without-validation", "step-trigger-waits", "link"])
def test_checkpoint_files_equal_lightnings(tmp_path: Path, checkpoint_kwargs: dict[str, Any],
                                           trainer_kwargs: dict[str, Any]) -> None:
    found = {side: _run(side, tmp_path, _ValLoss(), checkpoint_kwargs, **trainer_kwargs) for side in _SIDES}
    assert found["ours"] == found["lightning"]
    assert found["ours"][0]  # something was written


def test_the_checkpoint_resumed_from_is_never_deleted(tmp_path: Path) -> None:
    listings = {}
    for side in _SIDES:
        settings = {"monitor": "step", "mode": "max", "save_top_k": 2, "every_n_train_steps": 2}
        _run(side, tmp_path, BoringModel(), settings, max_epochs=None, max_steps=5, limit_train_batches=10,
             limit_val_batches=0)
        resume_from = str(tmp_path / side / "epoch=0-step=4.ckpt")
        listings[side] = _run(side, tmp_path, BoringModel(), settings, ckpt_path=resume_from, max_epochs=None,
                              max_steps=8, limit_train_batches=10, limit_val_batches=0)[0]
    assert listings["ours"] == listings["lightning"] == ["epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt",
                                                        "epoch=0-step=8.ckpt"]


def test_resuming_past_max_epochs_is_an_error(tmp_path: Path) -> None:
    _run("ours", tmp_path, BoringModel(), {"save_last": True}, max_epochs=3)
    with pytest.raises(RuntimeError, match="max_epochs=1"):
        _run("ours", tmp_path / "again", BoringModel(), {}, ckpt_path=str(tmp_path / "ours" / "last.ckpt"),
             max_epochs=1)


def test_checkpoint_names_and_last_files() -> None:
    ours, theirs = our_callbacks.ModelCheckpoint(dirpath=""), lightning_callbacks.ModelCheckpoint(dirpath="")
    for kwargs in ({}, {"prefix": "run"}, {"filename": "{epoch:03d}", "prefix": "run", "ver": 2}):
        metrics = {"epoch": 3, "step": 7}
        assert ours.format_checkpoint_name(metrics, **kwargs) == theirs.format_checkpoint_name(metrics, **kwargs)
    assert our_callbacks.ModelCheckpoint().every_n_epochs == 1


def test_find_last_checkpoints_lists_only_last_files(tmp_path: Path) -> None:
    for name in ("last.ckpt", "last-v1.ckpt", "last", "epoch=0-step=1.ckpt", "notes.txt"):
        (tmp_path / name).touch()
    callback = our_callbacks.ModelCheckpoint(dirpath=tmp_path)
    assert callback._find_last_checkpoints(None) == {str(tmp_path / "last.ckpt"), str(tmp_path / "last-v1.ckpt")}


def test_link_falls_back_to_a_copy_where_links_are_not_allowed(tmp_path: Path, monkeypatch: Any) -> None:
    class _Rank0:
        is_global_zero = True

        class strategy:  # noqa: N801 - stands in for trainer.strategy
            @staticmethod
            def barrier(name: str) -> None:
                pass

            @staticmethod
            def after_checkpoint_written(action: Any) -> None:
                action()  # no write in the background: the file is on disk now

    target, link = tmp_path / "epoch=1.ckpt", tmp_path / "last.ckpt"
    target.write_bytes(b"weights")
    our_callbacks.ModelCheckpoint._link_checkpoint(_Rank0(), str(target), str(link))
    assert os.path.islink(link) and not os.path.isabs(os.readlink(link))

    def refuse(*args: Any) -> None:
        raise OSError("symbolic links need privileges here")

    monkeypatch.setattr(os, "symlink", refuse)
    our_callbacks.ModelCheckpoint._link_checkpoint(_Rank0(), str(target), str(link))
    assert not os.path.islink(link) and link.read_bytes() == b"weights"


def test_link_needs_a_local_directory_and_checkpointing_must_be_on(tmp_path: Path) -> None:
    trainer = Trainer(default_root_dir=tmp_path, logger=False)
    with pytest.raises(ValueError, match="local directory"):
        our_callbacks.ModelCheckpoint(dirpath="s3://bucket/run", save_last="link").setup(trainer, BoringModel(), "fit")
    with pytest.raises(ValueError, match="enable_checkpointing=False"):
        Trainer(enable_checkpointing=False, callbacks=[our_callbacks.ModelCheckpoint()])


class _ThreeOptimizers(BoringModel):
    """Lightning's fine-tuning pattern: frozen layers are added to optimizers as new param groups."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.backbone = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32), torch.nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.backbone(x))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        for optimizer in self.optimizers():
            self.manual_backward(self.step(batch))
            optimizer.step()
            optimizer.zero_grad()

    def on_train_epoch_end(self) -> None:
        for scheduler in self.lr_schedulers():
            scheduler.step()

    def configure_optimizers(self) -> Any:
        trainable = [p for p in self.parameters() if p.requires_grad]
        optimizers = [torch.optim.SGD(trainable, lr=0.1), torch.optim.Adam(trainable, lr=0.1)]
        return optimizers, [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) for opt in optimizers]


class _Unfreeze(BackboneFinetuning):
    def freeze_before_training(self, module: Any) -> None:
        self.freeze(module.backbone[0])

    def finetune_function(self, module: Any, epoch: int, optimizer: Any) -> None:
        if epoch == 1 and isinstance(optimizer, torch.optim.SGD):
            self.unfreeze_and_add_param_group(module.backbone[0], optimizer, lr=0.1)


def test_learning_rate_series_follow_lightnings_when_param_groups_are_added(tmp_path: Path) -> None:
    series = {}
    for side, (trainer_class, callbacks) in _SIDES.items():
        monitor = callbacks.LearningRateMonitor()
        trainer = trainer_class(default_root_dir=tmp_path / side, max_epochs=3, limit_train_batches=2,
                                limit_val_batches=0, callbacks=[_Unfreeze(), monitor], logger=CSVLogger(tmp_path / side),
                                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(_ThreeOptimizers())
        series[side] = monitor.lrs
    assert list(series["ours"]) == list(series["lightning"])  # names, and their order
    assert series["ours"] == series["lightning"]


def test_duplicate_param_group_names_are_refused(tmp_path: Path) -> None:
    class Named(BoringModel):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD([{"params": [self.layer.weight], "name": "linear"},
                                    {"params": [self.layer.bias], "name": "linear"}], lr=0.1)

    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=1,
                      callbacks=[our_callbacks.LearningRateMonitor()], enable_progress_bar=False)
    with pytest.raises(ValueError, match="'linear'"):
        trainer.fit(Named())
