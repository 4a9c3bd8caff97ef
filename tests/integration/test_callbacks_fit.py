"""A real single-process `Trainer.fit` with ModelCheckpoint, EarlyStopping, LearningRateMonitor
and TensorBoardLogger: files on disk and values in the event files must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from strategies.checkpoint_io import TorchCheckpointIO
from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer
from trainer.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from trainer.loggers import TensorBoardLogger

pytestmark = pytest.mark.timeout(120)


class DecayingRegressor(TinyRegressor):
    """TinyRegressor with an epoch-interval StepLR, so the learning rate changes every epoch."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)}


def _scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _fit(tmp_path: Path, checkpoint: ModelCheckpoint, stopper: EarlyStopping, epochs: int,
         ckpt_path: str | None = None) -> tuple[Trainer, TinyRegressor]:
    torch.manual_seed(0)
    model = DecayingRegressor()
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=epochs, log_every_n_steps=1,
                      default_root_dir=tmp_path, logger=TensorBoardLogger(tmp_path),
                      # checkpoint last (Lightning moves it there): it saves the stopper's updated state
                      callbacks=[stopper, LearningRateMonitor(), checkpoint],
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=RegressionData(), ckpt_path=ckpt_path)
    return trainer, model


def test_fit_writes_top_k_last_and_matching_tensorboard_values(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=2, save_last=True, filename="{epoch}-{val_loss:.4f}")
    # min_delta so large that nothing after the first epoch counts as an improvement
    stopper = EarlyStopping(monitor="val_loss", patience=2, min_delta=1e9)
    trainer, _ = _fit(tmp_path, checkpoint, stopper, epochs=10)

    assert trainer.should_stop and stopper.stopped_epoch == 2 and stopper.wait_count == 2
    log_dir = str(tmp_path / "lightning_logs" / "version_0")
    assert trainer.logger is not None and trainer.logger.log_dir == log_dir
    scalars = _scalars(log_dir)
    val_losses = [value for _, value in scalars["val_loss"]]
    assert len(val_losses) == 3  # epochs 0, 1, 2, then early stopping

    # ModelCheckpoint: the two lowest val_loss epochs plus last.ckpt, under the logger's version dir
    ckpt_dir = Path(log_dir) / "checkpoints"
    assert checkpoint.dirpath == str(ckpt_dir)
    ranked = sorted(range(3), key=lambda epoch: val_losses[epoch])[:2]
    expected = {f"epoch={epoch}-val_loss={val_losses[epoch]:.4f}.ckpt" for epoch in ranked}
    assert {p.name for p in ckpt_dir.glob("*.ckpt")} == expected | {"last.ckpt"}
    assert float(checkpoint.best_model_score) == pytest.approx(min(val_losses), rel=1e-6)
    assert Path(checkpoint.best_model_path).name == f"epoch={ranked[0]}-val_loss={val_losses[ranked[0]]:.4f}.ckpt"

    last = TorchCheckpointIO().load(checkpoint.last_model_path)
    assert last["epoch"] == 2 and last["global_step"] == 24
    assert last["callbacks"][checkpoint.state_key]["best_model_path"] == checkpoint.best_model_path
    assert last["callbacks"][stopper.state_key]["wait_count"] == 2

    # LearningRateMonitor: one value per epoch start, halved each epoch by StepLR
    assert scalars["lr-SGD"] == [(0, pytest.approx(0.05)), (8, pytest.approx(0.025)), (16, pytest.approx(0.0125))]
    assert [step for step, _ in scalars["train_loss"]] == list(range(24))  # one per step, from 0 as in Lightning
    assert yaml.safe_load((Path(log_dir) / "hparams.yaml").read_text()) == {"features": 4, "lr": 0.05,
                                                                            "optimizer": "sgd"}


def test_resume_from_last_keeps_the_top_k(tmp_path: Path) -> None:
    ckpts = tmp_path / "ckpts"
    first = ModelCheckpoint(dirpath=ckpts, monitor="val_loss", save_top_k=2, save_last=True)
    _fit(tmp_path, first, EarlyStopping(monitor="val_loss", patience=5), epochs=2)
    second = ModelCheckpoint(dirpath=ckpts, monitor="val_loss", save_top_k=2, save_last=True)
    trainer, _ = _fit(tmp_path, second, EarlyStopping(monitor="val_loss", patience=5), epochs=4, ckpt_path="last")

    assert trainer.current_epoch == 4 and len(second.best_k_models) == 2
    # had the top-k state not been restored, the first run's two files would linger as extras
    kept = {p.name for p in ckpts.glob("*.ckpt")}
    assert kept == {Path(p).name for p in second.best_k_models} | {"last.ckpt"}
    assert float(second.best_model_score) <= float(first.best_model_score)
