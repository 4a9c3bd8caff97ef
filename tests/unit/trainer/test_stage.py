"""The Stage the loops take instead of the Trainer (trainer/stage.py): the Trainer's own parts, not copies,
so what a loop changes the Trainer reports and what a hook changes on the Trainer the loops see."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer
from trainer.batch_counts import num_batches
from trainer.stage import Stage


def _trainer(tmp_path: Path) -> Trainer:
    return Trainer(default_root_dir=str(tmp_path), max_epochs=1, limit_train_batches=4, logger=False,
                   enable_progress_bar=False, enable_checkpointing=False, on_nonfinite="skip")


def test_the_stage_holds_the_trainers_own_parts(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    stage = Stage.of(trainer)
    assert stage.trainer is trainer  # what user hooks receive
    assert stage.strategy is trainer.strategy and stage.callbacks is trainer.callback_list
    assert stage.metrics is trainer.metric_store and stage.data is trainer.data
    assert stage.progress is trainer.progress and stage.fit_run is trainer.fit_run and stage.status is trainer.state
    assert stage.precision is trainer.precision_plugin and stage.profiler is trainer.profiler
    trainer.should_stop = True  # as EarlyStopping sets it
    stage.progress.global_step = 7  # as the loop counts
    assert stage.fit_run.should_stop and trainer.global_step == 7


def test_settings_a_hook_may_change_are_read_when_used(tmp_path: Path) -> None:
    """The tuner and callbacks change limits on the Trainer while a stage runs: the Stage reads them then."""
    trainer = _trainer(tmp_path)
    stage = Stage.of(trainer)
    loader = DataLoader(TensorDataset(torch.zeros(10, 1)), batch_size=1)
    assert num_batches(stage.live, loader, "train") == 4
    trainer.limit_train_batches = 0.5
    assert num_batches(stage.live, loader, "train") == 5


def test_the_fixed_settings_are_one_frozen_record(tmp_path: Path) -> None:
    stage = Stage.of(_trainer(tmp_path))
    assert (stage.fixed.on_nonfinite, stage.fixed.use_distributed_sampler, stage.fixed.inference_mode,
            stage.fixed.detect_anomaly) == ("skip", True, True, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stage.fixed.on_nonfinite = "error"  # type: ignore[misc]


@pytest.mark.parametrize("trainer_class", ["lightning", "ours"])
def test_a_callback_changing_accumulation_mid_fit_is_seen_by_the_loops(tmp_path: Path, trainer_class: str) -> None:
    """Lightning's GradientAccumulationScheduler sets `trainer.accumulate_grad_batches` as each epoch starts:
    the loops read it then (the Stage does not freeze it), so the steps match Lightning's."""
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import GradientAccumulationScheduler
    from lightning.pytorch.demos.boring_classes import BoringModel

    make = pl.Trainer if trainer_class == "lightning" else Trainer
    trainer = make(default_root_dir=str(tmp_path), max_epochs=3, limit_train_batches=4, limit_val_batches=0,
                   logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                   callbacks=[GradientAccumulationScheduler(scheduling={0: 1, 1: 2, 2: 4})])
    trainer.fit(BoringModel())
    assert (trainer.global_step, trainer.accumulate_grad_batches) == (4 + 2 + 1, 4)


@pytest.mark.parametrize("trainer_class", ["lightning", "ours"])
def test_a_callback_shortening_the_fit_is_seen_by_the_fit_loop(tmp_path: Path, trainer_class: str) -> None:
    """`trainer.fit_loop.max_epochs = n` in a hook ends the fit after n epochs, as in Lightning: the fit loop's
    schedule reads max_epochs when it decides (its Stage does not freeze it)."""
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Shorten(pl.Callback):
        def on_train_epoch_end(self, trainer: object, module: object) -> None:
            trainer.fit_loop.max_epochs = 2  # type: ignore[attr-defined]

    make = pl.Trainer if trainer_class == "lightning" else Trainer
    trainer = make(default_root_dir=str(tmp_path), max_epochs=5, limit_train_batches=3, limit_val_batches=0,
                   logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                   callbacks=[Shorten()])
    trainer.fit(BoringModel())
    assert (trainer.current_epoch, trainer.global_step) == (2, 6)
