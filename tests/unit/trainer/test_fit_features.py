"""Single-process fit features, checked by value against a hand-written loop where possible."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from strategies.checkpoint_io import CheckpointError
from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer
from trainer.callbacks.base import Callback


# The resume tests also run on a GPU where one is visible: checkpoints come back onto the device.
ACCELERATORS = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                      reason="needs a CUDA device"))]


def _trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    """On the CPU unless asked: most tests compare against a hand-written loop on the CPU. No sanity
    check: these tests count the validations the schedule asks for."""
    defaults = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu",
                    enable_model_summary=False, default_root_dir=tmp_path, max_epochs=2, num_sanity_val_steps=0)
    return Trainer(**{**defaults, **kwargs})


def _manual_loop(epochs: int, accumulate: int = 1, clip: float | None = None) -> TinyRegressor:
    torch.manual_seed(0)
    model = TinyRegressor()
    data = RegressionData()
    data.setup("fit")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(epochs):
        for index, (x, y) in enumerate(data.train_dataloader()):
            (nn.functional.mse_loss(model(x), y) / accumulate).backward()
            if (index + 1) % accumulate == 0:
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                optimizer.zero_grad()
    return model


@pytest.mark.parametrize(("accumulate", "clip"), [(1, None), (2, None), (1, 0.5)])
def test_fit_matches_hand_written_loop(tmp_path: Path, accumulate: int, clip: float | None) -> None:
    torch.manual_seed(0)
    model = TinyRegressor()
    _trainer(tmp_path, accumulate_grad_batches=accumulate, gradient_clip_val=clip).fit(model, datamodule=RegressionData())
    reference = _manual_loop(2, accumulate, clip)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_gradient_clipping_by_value(tmp_path: Path) -> None:
    seen: list[float] = []

    class GradProbe(Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            # Lightning zeroes gradients before the next backward, so the step's clipped ones are still here
            seen.append(max(p.grad.abs().max().item() for p in pl_module.parameters()))

    _trainer(tmp_path, gradient_clip_val=0.01, gradient_clip_algorithm="value", max_epochs=1,
             callbacks=[GradProbe()]).fit(TinyRegressor(), datamodule=RegressionData())
    assert seen and max(seen) <= 0.01 + 1e-7


def test_max_steps_and_limits(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=10, max_steps=3)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    assert trainer.global_step == 3
    trainer = _trainer(tmp_path, max_epochs=2, limit_train_batches=0.5)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    assert trainer.global_step == 8 and trainer.num_training_batches == 4


def test_fast_dev_run(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, fast_dev_run=True, logger=True, enable_checkpointing=True)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    # Lightning: a DummyLogger that writes nothing (so self.logger.experiment.x(...) still runs)
    assert trainer.global_step == 1 and type(trainer.logger).__name__ == "DummyLogger"
    assert trainer.checkpoint_callback is None
    trainer.logger.experiment.add_scalar("x", 1.0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("interval", "every_n", "expected"), [(0.5, 1, 4), (3, 1, 4), (1.0, 2, 1), (1.0, 1, 2)])
def test_validation_schedule(tmp_path: Path, interval: float, every_n: int, expected: int) -> None:
    runs = []

    class Count(Callback):
        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            runs.append(trainer.global_step)

    _trainer(tmp_path, val_check_interval=interval, check_val_every_n_epoch=every_n,
             callbacks=[Count()]).fit(TinyRegressor(), datamodule=RegressionData())
    assert len(runs) == expected


@pytest.mark.parametrize("precision", ["bf16-mixed", "64-true", "16-mixed", "32"])
def test_precisions_train(tmp_path: Path, precision: str) -> None:
    dtypes = []

    class Model(TinyRegressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            out = self(x)
            dtypes.append(out.dtype)
            return nn.functional.mse_loss(out.float(), y.to(out.dtype).float())

    model = Model()
    trainer = _trainer(tmp_path, precision=precision, max_epochs=3)
    trainer.fit(model, datamodule=RegressionData())
    expected = {"bf16-mixed": torch.bfloat16, "64-true": torch.float64, "16-mixed": torch.float16,
                "32": torch.float32}[precision]
    assert dtypes[0] == expected
    assert float(trainer.callback_metrics["val_loss"]) < 5.0  # started near 30: it learned


def test_validate_test_predict_return_values(tmp_path: Path) -> None:
    model, data = TinyRegressor(), RegressionData()
    trainer = _trainer(tmp_path)
    trainer.fit(model, datamodule=data)
    val = trainer.validate(model, datamodule=data)
    test = trainer.test(model, datamodule=data)
    assert val[0]["val_loss"] == pytest.approx(test[0]["test_loss"])
    data.setup("predict")
    predictions = trainer.predict(model, dataloaders=data.val_dataloader())
    assert len(predictions) == 4 and predictions[0].shape == (8, 1)


class ScheduledModel(TinyRegressor):
    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        if self.form == "epoch":
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]
        if self.form == "step":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(
                opt, step_size=1, gamma=0.5), "interval": "step", "frequency": 4}}
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, patience=0, factor=0.5, threshold=10.0, threshold_mode="abs"), "monitor": "val_loss"}


@pytest.mark.parametrize(("form", "expected_lr"), [("epoch", 0.025), ("step", 0.1 * 0.5**4), ("plateau", 0.05)])
def test_schedulers(tmp_path: Path, form: str, expected_lr: float) -> None:
    trainer = _trainer(tmp_path)
    trainer.fit(ScheduledModel(form), datamodule=RegressionData())
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(expected_lr)


class ManualModel(TinyRegressor):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        assert isinstance(optimizer, torch.optim.SGD)
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        self.log("train_loss", loss)


def test_manual_optimization_matches_automatic(tmp_path: Path) -> None:
    torch.manual_seed(0)
    manual = ManualModel()
    trainer = _trainer(tmp_path)
    trainer.fit(manual, datamodule=RegressionData())
    assert trainer.global_step == 16
    reference = _manual_loop(2)
    torch.testing.assert_close(manual.layer.weight, reference.layer.weight, rtol=0, atol=1e-6)


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_resume_continues_exactly(tmp_path: Path, accelerator: str) -> None:
    torch.manual_seed(0)
    uninterrupted = TinyRegressor(optimizer="adam")
    _trainer(tmp_path, max_epochs=4, accelerator=accelerator).fit(uninterrupted,
                                                                  datamodule=RegressionData(shuffle=True))

    torch.manual_seed(0)
    first = TinyRegressor(optimizer="adam")
    trainer = _trainer(tmp_path, max_epochs=2, accelerator=accelerator)
    trainer.fit(first, datamodule=RegressionData(shuffle=True))
    trainer.save_checkpoint(tmp_path / "mid.ckpt")

    resumed = TinyRegressor(optimizer="adam")
    trainer = _trainer(tmp_path, max_epochs=4, accelerator=accelerator)
    trainer.fit(resumed, datamodule=RegressionData(shuffle=True), ckpt_path=str(tmp_path / "mid.ckpt"))
    assert trainer.current_epoch == 4 and trainer.global_step == 32
    torch.testing.assert_close(resumed.layer.weight, uninterrupted.layer.weight, rtol=0, atol=0)


def test_checkpoint_holds_everything_and_loads_weights_only(tmp_path: Path) -> None:
    model = TinyRegressor(lr=0.01)
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(model, datamodule=RegressionData())
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    checkpoint = torch.load(tmp_path / "a.ckpt", weights_only=True)
    # exactly Lightning's top-level keys; exact resumption's extras (every rank's RNG states) in "loops"
    assert {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "optimizer_states", "lr_schedulers",
            "loops", "callbacks", "hyper_parameters", "hparams_name"} == set(checkpoint)
    assert {"rng_states", "metrics"} <= set(checkpoint["loops"]["ddp_trainer"])
    restored = TinyRegressor.load_from_checkpoint(str(tmp_path / "a.ckpt"))
    assert restored.hparams.lr == 0.01
    torch.testing.assert_close(restored.layer.weight, model.layer.weight)


def test_bad_checkpoints_name_the_file(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.ckpt"
    torch.save({"state_dict": {}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:20])
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"weights": torch.ones(1)}, foreign)
    for path in (truncated, foreign, tmp_path / "missing.ckpt"):
        with pytest.raises(CheckpointError, match=path.name):
            _trainer(tmp_path).fit(TinyRegressor(), datamodule=RegressionData(), ckpt_path=str(path))


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(devices=0), ValueError, "devices"),
    (dict(max_epochs="abc"), TypeError, "max_epochs"),
    (dict(precision="17-bits"), ValueError, "precision"),
    (dict(accumulate_grad_batches=0), ValueError, "accumulate_grad_batches"),
    (dict(val_check_interval=1.5), ValueError, "val_check_interval"),
    (dict(limit_train_batches=-1), ValueError, "limit_train_batches"),
    (dict(gradient_clip_algorithm="l3"), ValueError, "gradient_clip_algorithm"),
    (dict(strategy="horovod"), ValueError, "strategy"),
    (dict(accelerator="tpu"), ValueError, "accelerator"),
])
def test_bad_arguments_fail_in_init(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Trainer(**kwargs)


def test_training_step_returning_dict_and_none(tmp_path: Path) -> None:
    class Model(TinyRegressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx % 2:
                return None
            return {"loss": super().training_step(batch, batch_idx), "extra": 1}

    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(Model(), datamodule=RegressionData())
    assert trainer.global_step == 8


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_mid_epoch_resume_with_dropout_is_bit_exact(tmp_path: Path, accelerator: str) -> None:
    """Resuming at batch 3 of 8 continues the sampler order and every RNG stream exactly (on a
    GPU, dropout draws from the device's generator, which the checkpoint must carry too)."""
    from tests.helpers.models import DropoutRegressor
    from trainer import seed_everything
    from trainer.callbacks import ModelCheckpoint

    def fit(ckpt_path: str | None = None) -> DropoutRegressor:
        seed_everything(1)
        model = DropoutRegressor()
        saver = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3, save_top_k=-1)
        _trainer(tmp_path, max_epochs=2, callbacks=[saver], enable_checkpointing=True, accelerator=accelerator).fit(
            model, datamodule=RegressionData(shuffle=True), ckpt_path=ckpt_path)
        return model

    uninterrupted = fit()
    resumed = fit(str(next((tmp_path / "ckpts").glob("*step=3*.ckpt"))))
    for ours, theirs in zip(resumed.parameters(), uninterrupted.parameters()):
        assert torch.equal(ours, theirs)


class _Stream(torch.utils.data.IterableDataset):
    """Unsized training data: the epoch ends when the iterator does."""

    def __iter__(self) -> Any:
        data = RegressionData()
        data.setup("fit")
        return iter(data.train_set)


class _CountValidations(Callback):
    def __init__(self) -> None:
        self.at: list[tuple[int, int]] = []

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.at.append((trainer.current_epoch, trainer.global_step))


def test_unsized_training_data_validates_when_each_epoch_ends(tmp_path: Path) -> None:
    counter = _CountValidations()
    data = RegressionData()
    data.setup("fit")
    train = torch.utils.data.DataLoader(_Stream(), batch_size=8)  # 64 samples: 8 steps per epoch
    _trainer(tmp_path, callbacks=[counter]).fit(TinyRegressor(), train_dataloaders=train,
                                                val_dataloaders=data.val_dataloader())
    assert counter.at == [(0, 8), (1, 16)]


def test_unsized_training_data_refuses_a_fractional_val_check_interval(tmp_path: Path) -> None:
    data = RegressionData()
    data.setup("fit")
    train = torch.utils.data.DataLoader(_Stream(), batch_size=8)
    with pytest.raises(ValueError, match="val_check_interval=0.5 is a fraction"):
        _trainer(tmp_path, val_check_interval=0.5).fit(TinyRegressor(), train_dataloaders=train,
                                                       val_dataloaders=data.val_dataloader())
