"""Lightning 2.6's callback arguments and attributes on our callbacks, in real fits: save_on_exception,
train_time_interval, to_yaml (ModelCheckpoint), stopping_reason (EarlyStopping),
last_momentum_values / last_weight_decay_values (LearningRateMonitor), and Lightning's own
EarlyStopping and ModelCheckpoint running in our Trainer."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer
from trainer.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from trainer.callbacks.early_stopping import EarlyStoppingReason
from trainer.loggers import CSVLogger


def _trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    defaults = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                    default_root_dir=tmp_path, max_epochs=2, num_sanity_val_steps=0, enable_telemetry=False)
    return Trainer(**{**defaults, **kwargs})


class _FailsAtStep(TinyRegressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == 5:
            raise RuntimeError("boom at step 5")
        return super().training_step(batch, batch_idx)


def test_save_on_exception_keeps_the_weights_reached(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_on_exception=True, every_n_epochs=10)
    model = _FailsAtStep()
    with pytest.raises(RuntimeError, match="boom at step 5"):
        _trainer(tmp_path, callbacks=[checkpoint]).fit(model, datamodule=RegressionData())
    saved = list((tmp_path / "ckpts").glob("*.ckpt"))
    assert len(saved) == 1 and "step=5" in saved[0].name
    state = torch.load(saved[0], weights_only=True)
    assert state["global_step"] == 5
    torch.testing.assert_close(state["state_dict"]["layer.weight"], model.layer.weight)


def test_train_time_interval_saves_during_the_epoch(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", train_time_interval=timedelta(0), save_top_k=-1)
    _trainer(tmp_path, callbacks=[checkpoint], max_epochs=1).fit(TinyRegressor(), datamodule=RegressionData())
    steps = sorted(int(p.stem.split("step=")[1]) for p in (tmp_path / "ckpts").glob("*.ckpt"))
    assert steps == list(range(1, 9))  # a zero interval is due after every batch
    with pytest.raises(ValueError, match="one of every_n_train_steps"):
        ModelCheckpoint(train_time_interval=timedelta(seconds=1), every_n_train_steps=2)


def test_to_yaml_writes_the_best_k(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", monitor="val_loss", save_top_k=2)
    _trainer(tmp_path, callbacks=[checkpoint], max_epochs=3).fit(TinyRegressor(), datamodule=RegressionData())
    checkpoint.to_yaml()
    written = yaml.safe_load((tmp_path / "ckpts" / "best_k_models.yaml").read_text())
    assert written == pytest.approx({path: float(score) for path, score in checkpoint.best_k_models.items()})
    assert len(written) == 2


def test_stopping_reason_names_why_and_survives_a_checkpoint(tmp_path: Path) -> None:
    stopper = EarlyStopping(monitor="val_loss", stopping_threshold=1e9)  # met at the first check
    trainer = _trainer(tmp_path, callbacks=[stopper], max_epochs=5)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    assert stopper.stopping_reason == EarlyStoppingReason.STOPPING_THRESHOLD
    assert "Stopping threshold reached" in (stopper.stopping_reason_message or "")
    assert trainer.current_epoch == 1
    restored = EarlyStopping(monitor="val_loss")
    restored.load_state_dict(stopper.state_dict())
    assert restored.stopping_reason == EarlyStoppingReason.STOPPING_THRESHOLD
    assert EarlyStopping(monitor="val_loss").stopping_reason == EarlyStoppingReason.NOT_STOPPED
    lightning_reasons = pytest.importorskip("lightning.pytorch.callbacks.early_stopping").EarlyStoppingReason
    assert stopper.stopping_reason == lightning_reasons.STOPPING_THRESHOLD  # code written against Lightning's enum
    assert lightning_reasons.STOPPING_THRESHOLD == stopper.stopping_reason
    assert stopper.stopping_reason != lightning_reasons.PATIENCE_EXHAUSTED


def test_lr_monitor_records_last_momentum_and_weight_decay(tmp_path: Path) -> None:
    class Momentum(TinyRegressor):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9, weight_decay=0.1)

    monitor = LearningRateMonitor(log_momentum=True, log_weight_decay=True)
    _trainer(tmp_path, callbacks=[monitor], logger=CSVLogger(tmp_path), max_epochs=1,
             log_every_n_steps=1).fit(Momentum(), datamodule=RegressionData())
    assert monitor.last_momentum_values == {"lr-SGD-momentum": 0.9}
    assert monitor.last_weight_decay_values == {"lr-SGD-weight_decay": 0.1}


def test_lightnings_own_early_stopping_and_checkpoint_run_in_our_trainer(tmp_path: Path) -> None:
    """Lightning's callbacks read a few private trainer members; our read-only views answer them."""
    pl_callbacks = pytest.importorskip("pytorch_lightning.callbacks")
    stopper = pl_callbacks.EarlyStopping(monitor="val_loss", stopping_threshold=1e9)
    checkpoint = pl_callbacks.ModelCheckpoint(dirpath=tmp_path / "pl", monitor="val_loss")
    trainer = _trainer(tmp_path, callbacks=[stopper, checkpoint], max_epochs=5)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    assert trainer.current_epoch == 1 and trainer.should_stop
    assert checkpoint.best_model_path and Path(checkpoint.best_model_path).is_file()
    assert trainer.checkpoint_callback is checkpoint


def test_save_last_link_points_at_the_newest_checkpoint(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last="link", save_top_k=-1)
    _trainer(tmp_path, callbacks=[checkpoint], max_epochs=2).fit(TinyRegressor(), datamodule=RegressionData())
    last = tmp_path / "ckpts" / "last.ckpt"
    assert last.is_symlink() and last.resolve().name == "epoch=1-step=16.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 16
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["epoch=0-step=8.ckpt", "epoch=1-step=16.ckpt",
                                                                       "last.ckpt"]


def test_signature_annotations_are_objects_for_cli_tools() -> None:
    import inspect

    annotation = inspect.signature(ModelCheckpoint).parameters["save_last"].annotation
    assert not isinstance(annotation, str) and "link" in repr(annotation)


def test_lr_monitor_counts_batches_not_optimizer_steps_and_warns_without_momentum(tmp_path: Path) -> None:
    class TwoOptimizers(TinyRegressor):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            for optimizer in self.optimizers():
                optimizer.zero_grad()
                self.manual_backward(torch.nn.functional.mse_loss(self(batch[0]), batch[1]))
                optimizer.step()

        def configure_optimizers(self) -> Any:
            return [torch.optim.ASGD(self.parameters(), lr=0.01), torch.optim.ASGD(self.parameters(), lr=0.02)]

    monitor = LearningRateMonitor(logging_interval="step", log_momentum=True)
    trainer = _trainer(tmp_path, callbacks=[monitor], logger=CSVLogger(tmp_path), max_epochs=1, log_every_n_steps=2)
    with pytest.warns(RuntimeWarning, match="do not have momentum"):
        trainer.fit(TwoOptimizers(), datamodule=RegressionData())
    assert trainer.global_step == 16  # two optimizer steps a batch
    assert monitor.lrs == {"lr-ASGD": [0.01] * 4, "lr-ASGD-1": [0.02] * 4}  # every 2nd of 8 batches


def test_a_datamodules_transfer_hook_wins_over_the_modules(tmp_path: Path) -> None:
    class Doubling(RegressionData):
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return [batch[0] * 0.0, batch[1] * 0.0]

    class Probe(TinyRegressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            assert float(batch[0].abs().sum()) == 0.0
            return super().training_step(batch, batch_idx)

    _trainer(tmp_path, max_epochs=1).fit(Probe(), datamodule=Doubling())


def test_callbacks_log_through_the_module_as_in_lightning(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.demos.boring_classes import BoringModel

    class LogsFromHooks(pl.Callback):
        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.log("from_train_start", 1.0)

        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            self.log("from_epoch_start", 2.0)

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.log_dict({"from_batch_end": 3.0})

    metrics = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        trainer = trainer_class(default_root_dir=tmp_path / name, limit_train_batches=2, limit_val_batches=1,
                                max_epochs=2, callbacks=[LogsFromHooks()], logger=False, enable_progress_bar=False,
                                enable_model_summary=False)
        trainer.fit(BoringModel())
        metrics[name] = {key: float(value) for key, value in trainer.callback_metrics.items()}
    assert metrics["ours"] == metrics["lightning"]
    assert metrics["ours"]["from_train_start"] == 1.0
