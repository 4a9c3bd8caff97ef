"""Where `self.log` may be called and what it records there by default (trainer/log_rules.py),
against Lightning's Trainer: the same module and callback try `self.log` in every hook, with the
hook's defaults and with each on_step/on_epoch combination, in fit, test and predict; which
attempts are refused, and the metrics the accepted ones leave, must be Lightning's."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

from trainer import LightningModule, Trainer  # noqa: E402
from trainer.log_rules import LoggingError  # noqa: E402

_MODULE_HOOKS = (
    "setup", "configure_model", "configure_optimizers", "on_fit_start", "on_train_start", "on_train_epoch_start",
    "on_train_batch_start", "on_before_zero_grad", "optimizer_zero_grad", "on_before_backward", "backward",
    "on_after_backward", "on_before_optimizer_step", "configure_gradient_clipping", "optimizer_step",
    "lr_scheduler_step", "on_train_batch_end", "on_train_epoch_end", "on_validation_model_zero_grad",
    "on_validation_model_eval", "on_validation_model_train", "on_validation_start", "on_validation_epoch_start",
    "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "on_save_checkpoint",
    "on_train_end", "on_fit_end", "teardown", "on_test_model_eval", "on_test_model_train", "on_test_start",
    "on_test_epoch_start", "on_test_batch_start", "on_test_batch_end", "on_test_epoch_end", "on_test_end",
    "on_predict_model_eval", "on_predict_start", "on_predict_epoch_start", "on_predict_batch_start",
    "on_predict_batch_end", "on_predict_epoch_end", "on_predict_end",
)
_CALLBACK_HOOKS = (
    "setup", "on_fit_start", "on_sanity_check_start", "on_sanity_check_end", "on_train_start",
    "on_train_epoch_start", "on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_train_batch_end", "on_train_epoch_end", "on_validation_start",
    "on_validation_epoch_start", "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_end",
    "on_validation_end", "on_save_checkpoint", "on_train_end", "on_fit_end", "teardown", "on_test_start",
    "on_test_epoch_start", "on_test_batch_start", "on_test_batch_end", "on_test_epoch_end", "on_test_end",
    "on_predict_start", "on_predict_epoch_start", "on_predict_batch_start", "on_predict_batch_end",
    "on_predict_epoch_end", "on_predict_end",
)
_COMBINATIONS = list(itertools.product((False, True), repeat=2))  # (on_step, on_epoch)


def _try_logging(module: Any, hook: str, who: str) -> None:
    """Log with the hook's defaults and with every on_step/on_epoch combination; record refusals.
    Each value is how often its name was logged, so an epoch mean differs from the last step."""
    for on_step, on_epoch in [(None, None), *_COMBINATIONS]:
        name = f"{who}.{hook}" + ("" if on_step is None else f".{int(on_step)}{int(on_epoch)}")
        module.counts[name] += 1
        try:
            module.log(name, float(module.counts[name]), on_step=on_step, on_epoch=on_epoch)
            module.outcomes[name] = "logged"
        except (LoggingError, MisconfigurationException):
            module.outcomes[name] = "refused"


def _probing(hook: str) -> Any:
    def hook_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = getattr(super(_Probe, self), hook)(*args, **kwargs)
        _try_logging(self, hook, "module")
        return result

    return hook_method


class _Probe(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.outcomes: dict[str, str] = {}
        self.counts: Counter[str] = Counter()

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        _try_logging(self, "configure_optimizers", "module")
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        _try_logging(self, "training_step", "module")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        _try_logging(self, "validation_step", "module")
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        _try_logging(self, "test_step", "module")
        return super().test_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        _try_logging(self, "predict_step", "module")
        return super().predict_step(batch, batch_idx, dataloader_idx)

    def train_dataloader(self) -> Any:
        _try_logging(self, "train_dataloader", "module")
        return DataLoader(RandomDataset(32, 8), batch_size=4)

    def val_dataloader(self) -> Any:
        _try_logging(self, "val_dataloader", "module")
        return DataLoader(RandomDataset(32, 8), batch_size=4)

    test_dataloader = predict_dataloader = val_dataloader


for _hook in _MODULE_HOOKS:
    setattr(_Probe, _hook, _probing(_hook))


class _ProbeCallback(pl.Callback):
    pass


for _hook in _CALLBACK_HOOKS:
    setattr(_ProbeCallback, _hook, lambda self, trainer, module, *args, _hook=_hook, **kwargs:
            _try_logging(module, _hook, "callback"))


def _run(trainer_class: Any, root: Path) -> dict[str, Any]:
    module = _Probe()
    trainer = trainer_class(default_root_dir=root, max_epochs=2, limit_train_batches=2, limit_val_batches=2,
                            limit_test_batches=2, limit_predict_batches=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[_ProbeCallback()])
    found: dict[str, Any] = {}
    trainer.fit(module)
    found["fit"] = {key: round(float(value), 4) for key, value in trainer.callback_metrics.items()}
    found["fit logged"] = sorted(trainer.logged_metrics)
    trainer.test(module, verbose=False)
    found["test"] = {key: round(float(value), 4) for key, value in trainer.callback_metrics.items()}
    trainer.predict(module)
    found["outcomes"] = module.outcomes
    return found


def test_where_self_log_works_and_its_defaults_match_lightning(tmp_path: Path) -> None:
    lightning, ours = _run(pl.Trainer, tmp_path / "lightning"), _run(Trainer, tmp_path / "ours")
    assert ours["outcomes"] == lightning["outcomes"]
    assert ours == lightning
    outcomes = ours["outcomes"]
    assert outcomes["module.optimizer_step"] == "logged" and outcomes["callback.on_fit_start"] == "refused"
    assert outcomes["module.on_train_epoch_end.11"] == "refused"  # no step to log at
    assert outcomes["module.predict_step"] == "refused" and outcomes["module.training_step.00"] == "refused"
    assert ours["fit"]["module.optimizer_step"] == 4.0  # per step by default: the 4th step's value, not a mean


class _Misuse(BoringModel):
    """Logs one thing Lightning refuses in training_step (or nothing, for "nothing")."""

    def __init__(self, misuse: str) -> None:
        super().__init__()
        self.misuse = misuse
        self.owned = pytest.importorskip("torchmetrics").MeanMetric()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        if self.misuse == "dataloader suffix":
            self.log("loss/dataloader_idx_0", 1.0)
        elif self.misuse == "metric not an attribute":
            self.log("mean", pytest.importorskip("torchmetrics").MeanMetric())
        elif self.misuse == "changed options":
            self.log("x", 1.0)
            self.log("x", 1.0, prog_bar=True)
        elif self.misuse == "reduce_fx":
            self.log("x", 1.0, reduce_fx=torch.argmax)
        else:
            self.owned(1.0)
            self.log("mean", self.owned)
            self.log("own/dataloader_idx_0", 1.0, add_dataloader_idx=False)
        return loss


@pytest.mark.parametrize("misuse", ["dataloader suffix", "metric not an attribute", "changed options", "reduce_fx",
                                    "nothing"])
def test_misused_self_log_is_refused_as_in_lightning(tmp_path: Path, misuse: str) -> None:
    refused = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        trainer = trainer_class(default_root_dir=tmp_path / name, max_epochs=1, limit_train_batches=1,
                                limit_val_batches=0, logger=False, enable_progress_bar=False,
                                enable_checkpointing=False, enable_model_summary=False)
        try:
            trainer.fit(_Misuse(misuse))
            refused[name] = False
        except (LoggingError, MisconfigurationException):
            refused[name] = True
    assert refused["ours"] == refused["lightning"] == (misuse != "nothing")


def test_a_step_called_outside_a_trainer_warns_and_logs_nothing() -> None:
    with pytest.warns(UserWarning, match="not attached to a Trainer"):  # Lightning warns too
        LightningModule().log("x", 1.0)
