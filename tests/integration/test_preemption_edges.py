"""Preemption edge cases found in review, one process each (the agreement's multi-rank cases are in
tests/distributed/test_preemption.py): unsized data, a notice before a resume has put back its
position, a resumed run that crashes later, another run's checkpoint, a preemption save that fails."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from strategies import SingleDeviceStrategy
from strategies.checkpoint_io import CheckpointError, TorchCheckpointIO
from strategies.preemption import Preempted
from tests.helpers.models import DropoutRegressor, RegressionData
from tests.helpers.preemption import NoticeAtStep, SignalAtStepSteps
from trainer import LightningModule, Trainer, seed_everything
from trainer.callbacks import Callback, ModelCheckpoint


def _trainer(root: Path, **kwargs: Any) -> Trainer:
    kwargs = {"max_epochs": 3, "logger": False, "enable_checkpointing": False, **kwargs}
    return Trainer(accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, **kwargs)


def _equal(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(value, b.state_dict()[key]) for key, value in a.state_dict().items())


class Stream(IterableDataset):
    def __iter__(self) -> Any:
        generator = torch.Generator().manual_seed(0)
        for _ in range(6):
            x = torch.randn(8, 4, generator=generator)
            yield x, x.sum(1, keepdim=True)


class StreamRegressor(SignalAtStepSteps, LightningModule):
    """Unsized data, validation at each epoch's end and a plateau scheduler fed by it."""

    def __init__(self, notice_at: int = -1) -> None:
        super().__init__()
        self.net, self.notice_at, self.validations = nn.Linear(4, 1), notice_at, 0

    def on_validation_epoch_end(self) -> None:
        self.validations += 1

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5, mode="max")
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Stream(), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Stream(), batch_size=None)


def test_unsized_data_stopped_at_an_epochs_last_batch_runs_that_epochs_end_once(tmp_path: Path) -> None:
    """The loop fetches one batch ahead, so it knows an unsized epoch's last batch: a notice there stops
    after that epoch's end (validation, the plateau scheduler) has run, and the resumed fit must not run
    it again - one validation per epoch across both fits, and the weights of an uninterrupted fit."""
    seed_everything(1)
    plain = StreamRegressor()
    _trainer(tmp_path / "plain", num_sanity_val_steps=0).fit(plain)
    seed_everything(1)
    stopped = StreamRegressor(notice_at=5)
    with pytest.raises(Preempted) as preempted:
        _trainer(tmp_path / "run", num_sanity_val_steps=0).fit(stopped)
    assert preempted.value.step == 6  # after the 6th and last batch of epoch 0
    assert torch.load(tmp_path / "run" / "preempted.ckpt", weights_only=True)["epoch"] == 1
    seed_everything(1)
    resumed = StreamRegressor()
    _trainer(tmp_path / "run", num_sanity_val_steps=0).fit(resumed)
    assert (stopped.validations, resumed.validations, plain.validations) == (1, 2, 3)
    assert _equal(plain, resumed)


class NoticeAtFitStart(Callback):
    def on_fit_start(self, trainer: Any, module: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_notice_before_a_resume_has_put_back_its_position_waits_for_it(tmp_path: Path) -> None:
    """A requeued run preempted again while it sets up: the second checkpoint must hold the first one's
    position and random state (not the fresh process's), so the final weights stay exact."""
    seed_everything(11)
    plain = DropoutRegressor()
    _trainer(tmp_path / "plain").fit(plain, datamodule=RegressionData(batch_size=8, shuffle=True))
    run = tmp_path / "run"
    seed_everything(11)
    with pytest.raises(Preempted):
        _trainer(run).fit(NoticeAtStep(5, "rank0"), datamodule=RegressionData(batch_size=8, shuffle=True))
    first = torch.load(run / "preempted.ckpt", weights_only=True)
    seed_everything(11)
    with pytest.raises(Preempted) as again:
        _trainer(run, callbacks=[NoticeAtFitStart()]).fit(NoticeAtStep(5, "rank0"),
                                                          datamodule=RegressionData(batch_size=8, shuffle=True))
    second = torch.load(run / "preempted.ckpt", weights_only=True)
    assert again.value.step == first["global_step"] + 1  # one step after the resume, not before it
    seed_everything(11)
    resumed = NoticeAtStep(5, "rank0")
    _trainer(run).fit(resumed, datamodule=RegressionData(batch_size=8, shuffle=True))
    assert second["global_step"] > first["global_step"] and _equal(plain, resumed)


class CrashAtStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError("injected crash")


class FirstStep(Callback):
    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.step = trainer.global_step


def test_a_resumed_run_that_crashes_later_does_not_rewind_to_the_preemption_checkpoint(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpts"

    def trainer(*callbacks: Callback) -> Trainer:
        periodic = ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=2, save_top_k=-1)
        return _trainer(tmp_path, enable_checkpointing=True, callbacks=[periodic, *callbacks])

    seed_everything(11)
    with pytest.raises(Preempted):
        trainer().fit(NoticeAtStep(5, "rank0"), datamodule=RegressionData(batch_size=8, shuffle=True))
    with pytest.raises(RuntimeError, match="injected crash"):
        trainer(CrashAtStep(11)).fit(NoticeAtStep(5, "rank0"), datamodule=RegressionData(batch_size=8, shuffle=True))
    first = FirstStep()
    trainer(first).fit(NoticeAtStep(5, "rank0"), datamodule=RegressionData(batch_size=8, shuffle=True))
    assert first.step == 10, "resumed from the newest checkpoint of the run (step 10), not the preemption one (6)"
    assert not (tmp_path / "preempted.ckpt").exists()


def test_another_runs_preemption_checkpoint_is_not_resumed(tmp_path: Path) -> None:
    """A sweep sharing one directory: a fit with other hyperparameters starts from scratch (warned) and
    leaves the other run's checkpoint in place; the same run resumes it."""
    seed_everything(11)
    with pytest.raises(Preempted):
        _trainer(tmp_path).fit(NoticeAtStep(5, "rank0"), datamodule=RegressionData(batch_size=8, shuffle=True))
    for other in (NoticeAtStep(-1, lr=0.2), DropoutRegressor()):  # other hyperparameters; another model
        first = FirstStep()
        with pytest.warns(UserWarning, match="was written by another run"):
            _trainer(tmp_path, callbacks=[first]).fit(other, datamodule=RegressionData(batch_size=8, shuffle=True))
        assert first.step == 0 and (tmp_path / "preempted.ckpt").exists()
    same = FirstStep()
    _trainer(tmp_path, callbacks=[same]).fit(NoticeAtStep(5, "rank0"),
                                             datamodule=RegressionData(batch_size=8, shuffle=True))
    assert same.step == 6


class FullDisk(TorchCheckpointIO):
    def save(self, checkpoint: dict[str, Any], path: Any) -> None:
        raise CheckpointError(f"Could not write checkpoint {str(path)!r}: No space left on device (errno 28)")


def test_a_preemption_checkpoint_that_cannot_be_written_still_ends_the_job_as_preempted(tmp_path: Path) -> None:
    seed_everything(11)
    trainer = _trainer(tmp_path, strategy=SingleDeviceStrategy(checkpoint_io=FullDisk()))
    with pytest.raises(Preempted) as stopped:
        trainer.fit(NoticeAtStep(5, "rank0"), datamodule=RegressionData(batch_size=8, shuffle=True))
    assert stopped.value.checkpoint_path is None and stopped.value.code == 75
    assert isinstance(stopped.value.__cause__, CheckpointError) and "No space left" in str(stopped.value.__cause__)
