"""Lightning 2.6's Trainer arguments with Lightning's meaning (checked against Lightning's Trainer
where it has the same attribute): PL_TRAINER_* environment defaults, max_epochs=None, barebones,
max_time, overfit_batches, min_epochs, refused arguments."""

from __future__ import annotations

import inspect
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer
from trainer.callbacks import Callback


def _trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    defaults = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                    enable_checkpointing=False, default_root_dir=tmp_path, num_sanity_val_steps=0,
                    enable_telemetry=False)
    return Trainer(**{**defaults, **kwargs})


def test_environment_variables_replace_defaults_not_explicit_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    assert Trainer().max_steps == 7 and Trainer().logger is None
    assert Trainer(max_steps=3).max_steps == 3


def test_max_epochs_none_means_max_steps_or_a_thousand_epochs(tmp_path: Path) -> None:
    assert Trainer().max_epochs is None  # as in Lightning; the loop uses 1000 epochs
    trainer = _trainer(tmp_path, max_steps=11)
    assert trainer.max_epochs is None  # as in Lightning: settled when fit starts
    trainer.fit(TinyRegressor(), datamodule=RegressionData())  # 8 batches an epoch: the limit is max_steps
    assert trainer.global_step == 11 and trainer.current_epoch == 2  # Lightning's values for the same run


def test_barebones_switches_off_what_costs_speed_and_refuses_conflicts() -> None:
    trainer = Trainer(barebones=True)
    assert trainer.loggers == [] and trainer.checkpoint_callback is None and trainer.progress_bar_callback is None
    assert trainer.num_sanity_val_steps == 0 and trainer.log_every_n_steps == 0
    with pytest.raises(ValueError, match="barebones=True, enable_checkpointing=True"):
        Trainer(barebones=True, enable_checkpointing=True)


@pytest.mark.parametrize("package", ["lightning", "ours"])
def test_self_log_under_barebones_warns_and_logs_nothing(tmp_path: Path, package: str) -> None:
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Logs(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            output = super().training_step(batch, batch_idx)
            self.log("train_loss", output["loss"])
            return output

    trainer_class = pl.Trainer if package == "lightning" else Trainer
    trainer = trainer_class(barebones=True, max_steps=2, accelerator="cpu", default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match="barebones=True"):
        trainer.fit(Logs())
    assert trainer.global_step == 2 and dict(trainer.callback_metrics) == {}


@pytest.mark.parametrize(("value", "expected"), [("00:01:00:00", timedelta(hours=1)),
                                                 ({"minutes": 5}, timedelta(minutes=5)),
                                                 (timedelta(seconds=3), timedelta(seconds=3))])
def test_max_time_forms(value: Any, expected: timedelta) -> None:
    assert Trainer(max_time=value).max_time == expected


def test_max_time_stops_at_the_next_batch(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_time=timedelta(0), max_epochs=5)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    assert trainer.global_step == 1


def test_overfit_batches_trains_on_the_same_first_batches_unshuffled(tmp_path: Path) -> None:
    seen: list[torch.Tensor] = []

    class Record(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            seen.append(batch[0].clone())

    trainer = _trainer(tmp_path, overfit_batches=2, max_epochs=2, callbacks=[Record()])
    trainer.fit(TinyRegressor(), datamodule=RegressionData(shuffle=True))
    assert len(seen) == 4 and trainer.num_training_batches == 2
    data = RegressionData()
    data.setup("fit")
    torch.testing.assert_close(seen[0], data.train_set.tensors[0][:8])  # in order: shuffling switched off
    torch.testing.assert_close(seen[2], seen[0])


def test_should_stop_waits_for_min_epochs(tmp_path: Path) -> None:
    class StopAtOnce(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            trainer.should_stop = True

    trainer = _trainer(tmp_path, min_epochs=3, max_epochs=10, callbacks=[StopAtOnce()])
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    assert trainer.current_epoch == 3


@pytest.mark.parametrize("name", ["plugins", "model_registry"])
def test_arguments_we_cannot_honour_are_refused_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"Trainer\\({name}="):
        Trainer(**{name: "simple"})


@pytest.mark.parametrize(("interval", "every_n_epochs"), [(0.5, None), (1.0, None), (None, None), (3, None),
                                                          (0.5, 1)])
def test_a_fraction_of_an_epoch_needs_epochs_to_validate_by_as_in_lightning(tmp_path: Path, interval: Any,
                                                                           every_n_epochs: int | None) -> None:
    """check_val_every_n_epoch=None counts batches across epochs: Lightning refuses a float
    val_check_interval there (the default, None, is fine); where it accepts one, validation runs at
    the same steps."""
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    validated_at: list[int] = []

    class Record(pl.Callback):
        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            validated_at.append(trainer.global_step)

    found: dict[str, Any] = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        validated_at.clear()
        try:
            trainer = trainer_class(val_check_interval=interval, check_val_every_n_epoch=every_n_epochs, max_epochs=2,
                                    limit_train_batches=4, limit_val_batches=1, num_sanity_val_steps=0, logger=False,
                                    enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                                    default_root_dir=tmp_path / name, callbacks=[Record()])
        except (ValueError, MisconfigurationException):
            found[name] = "refused"
            continue
        trainer.fit(BoringModel())
        found[name] = list(validated_at)
    assert found["ours"] == found["lightning"]
    assert (found["ours"] == "refused") == (isinstance(interval, float) and every_n_epochs is None)


@pytest.mark.parametrize("package", ["lightning", "ours"])
def test_small_arguments_read_as_in_lightning(package: str) -> None:
    """fast_dev_run=1 reads True; a "~" in default_root_dir is expanded; init_module builds on the
    run's device in its dtype ("64-true": float64)."""
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringModel

    trainer_class = pl.Trainer if package == "lightning" else Trainer
    assert trainer_class(fast_dev_run=1).fast_dev_run is True and trainer_class(fast_dev_run=3).fast_dev_run == 3
    assert trainer_class(default_root_dir="~/runs").default_root_dir == str(Path.home() / "runs")
    trainer = trainer_class(accelerator="cpu", devices=1, precision="64-true")
    with trainer.init_module():
        model = BoringModel()
    assert model.layer.weight.dtype == torch.float64 and model.device == torch.device("cpu")
    assert torch.get_default_dtype() == torch.float32


def test_init_module_refuses_empty_init_rather_than_ignoring_it() -> None:
    with pytest.raises(ValueError, match="empty_init=True"), Trainer(accelerator="cpu").init_module(empty_init=True):
        pass


@pytest.mark.parametrize("package", ["lightning", "ours"])
def test_strict_loading_false_resumes_a_partial_checkpoint(tmp_path: Path, package: str) -> None:
    """A module that saves only part of its state (here: not its frozen `extra` layer) resumes from
    that checkpoint when it sets `strict_loading = False`, as in Lightning."""
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Partial(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.extra = torch.nn.Linear(2, 2)
            self.strict_loading = False

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("extra")}

    trainer_class = pl.Trainer if package == "lightning" else Trainer
    options = dict(default_root_dir=tmp_path, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, limit_val_batches=0)
    first = trainer_class(max_steps=2, **options)
    first.fit(Partial())
    first.save_checkpoint(tmp_path / "partial.ckpt")
    resumed = trainer_class(max_steps=4, **options)
    resumed.fit(Partial(), ckpt_path=str(tmp_path / "partial.ckpt"))
    assert resumed.global_step == 4


@pytest.mark.parametrize("interval", [0.25, 3, 1.0])
def test_val_check_batch_is_lightnings(tmp_path: Path, interval: Any) -> None:
    """`trainer.val_check_batch`: the training batches between validations, as Lightning's Trainer reports it."""
    pl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.demos.boring_classes import BoringModel

    seen = []
    for trainer_class in (pl.Trainer, Trainer):
        trainer = trainer_class(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=10, limit_val_batches=1,
                                val_check_interval=interval, num_sanity_val_steps=0, logger=False,
                                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(BoringModel())
        seen.append(trainer.val_check_batch)
    assert seen[1] == seen[0] == {0.25: 2, 3: 3, 1.0: 10}[interval]


def test_every_argument_is_kept_as_a_typed_attribute_or_builds_a_part() -> None:
    """A new Trainer argument must be declared: kept (a class annotation, read by loops and callbacks) or
    turned into a part (`_BUILT_FROM`); `devices` is kept as `num_devices`."""
    from trainer.trainer import _BUILT_FROM

    arguments = {name for name in inspect.signature(Trainer).parameters}
    kept = set(inspect.get_annotations(Trainer)) - {"num_devices"}
    assert arguments - set(_BUILT_FROM) == kept and set(_BUILT_FROM) <= arguments
    trainer = Trainer(devices=1)
    assert all(hasattr(trainer, name) for name in kept) and trainer.num_devices == 1
