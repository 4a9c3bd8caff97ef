"""The real hook order of a fit equals the order documented in trainer/callbacks/base.py."""

from __future__ import annotations

from typing import Any

from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer
from trainer.callbacks.base import HOOK_NAMES, Callback


class Recorder(Callback):
    def __init__(self) -> None:
        self.calls: list[str] = []


def _recording(name: str) -> Any:
    def hook(self: Recorder, trainer: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        self.calls.append(name)
    return hook


for _name in HOOK_NAMES:
    setattr(Recorder, _name, _recording(_name))

# Lightning's order: zero_grad before backward, inside the optimizer's closure
BATCH = ["on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
         "on_before_optimizer_step", "on_train_batch_end"]
VALIDATION = ["on_validation_start", "on_validation_epoch_start", "on_validation_batch_start",
              "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end"]


def test_fit_hook_order_matches_documentation(tmp_path: Any) -> None:
    recorder = Recorder()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, callbacks=[recorder],
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    expected = (["setup", "on_fit_start", "on_sanity_check_start"] + VALIDATION + ["on_sanity_check_end",
                "on_train_start", "on_train_epoch_start"] + BATCH + BATCH + VALIDATION
                + ["on_train_epoch_end", "on_train_end", "on_fit_end", "teardown"])
    assert recorder.calls == expected


def test_accumulation_steps_the_optimizer_once_per_window(tmp_path: Any) -> None:
    recorder = Recorder()
    trainer = Trainer(max_epochs=1, limit_train_batches=4, accumulate_grad_batches=2, limit_val_batches=0,
                      callbacks=[recorder], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    assert recorder.calls.count("on_after_backward") == 4
    assert recorder.calls.count("on_before_optimizer_step") == 2
    assert trainer.global_step == 2


def test_module_hooks_run_after_callback_hooks(tmp_path: Any) -> None:
    order: list[str] = []

    class Module(TinyRegressor):
        def on_train_epoch_end(self) -> None:
            order.append("module")

    class Marker(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            order.append("callback")

    Trainer(max_epochs=1, limit_train_batches=1, callbacks=[Marker()], logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=tmp_path).fit(Module(), datamodule=RegressionData())
    assert order == ["callback", "module"]
