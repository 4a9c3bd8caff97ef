"""`trainer.state` and Ctrl-C, with Lightning's Trainer as the oracle: the same unchanged
pytorch_lightning module, callback and datamodule under `pytorch_lightning.Trainer` and ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer import Trainer


def _trainer(trainer_class: Any, tmp_path: Path, **kwargs: Any) -> Any:
    return trainer_class(default_root_dir=tmp_path, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, **kwargs)


@pytest.fixture(params=["lightning", "ours"])
def trainer_class(request: pytest.FixtureRequest) -> Any:
    import pytorch_lightning as pl

    return pl.Trainer if request.param == "lightning" else Trainer


def test_state_compares_equal_to_lightnings_and_says_finished(trainer_class: Any, tmp_path: Path) -> None:
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.trainer.states import TrainerFn, TrainerState, TrainerStatus

    trainer = _trainer(trainer_class, tmp_path, max_steps=2, limit_val_batches=1)
    assert trainer.state == TrainerState(status=TrainerStatus.INITIALIZING, fn=None, stage=None)
    assert not trainer.state.finished and not trainer.state.stopped
    trainer.fit(BoringModel())
    assert trainer.state == TrainerState(status=TrainerStatus.FINISHED, fn=TrainerFn.FITTING, stage=None)
    assert trainer.state.finished and trainer.state.stopped and not trainer.interrupted
    assert trainer.state != TrainerState(status=TrainerStatus.FINISHED, fn=TrainerFn.TESTING, stage=None)


def test_ctrl_c_runs_the_exception_hooks_then_exits_1(trainer_class: Any, tmp_path: Path) -> None:
    """Lightning's graceful shutdown: every callback's and the datamodule's `on_exception` see the
    KeyboardInterrupt, the state says interrupted, and the script ends with SystemExit(1)."""
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringDataModule, BoringModel

    seen: list[str] = []

    class Interrupt(pl.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == 1:
                raise KeyboardInterrupt

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            seen.append(f"callback:{type(exception).__name__}")

    class Data(BoringDataModule):
        def on_exception(self, exception: BaseException) -> None:
            seen.append(f"datamodule:{type(exception).__name__}")

    trainer = _trainer(trainer_class, tmp_path, max_epochs=1, callbacks=[Interrupt()])
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(BoringModel(), datamodule=Data())
    assert stopped.value.code == 1
    assert seen == ["callback:KeyboardInterrupt", "datamodule:KeyboardInterrupt"]
    assert trainer.interrupted and trainer.state.stopped and not trainer.state.finished


def _restarting_trace(trainer_class: Any, root: Path) -> dict[str, list[tuple[Any, ...]]]:
    """`trainer.fit_loop.restarting` at each hook of a fresh fit, a resume from a checkpoint written
    after a fit, and one from a checkpoint written inside an epoch."""
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringModel

    trace: list[tuple[Any, ...]] = []

    class Spy(pl.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            trace.append(("train_start", trainer.current_epoch, trainer.fit_loop.restarting))

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            trace.append(("epoch_start", trainer.current_epoch, trainer.fit_loop.restarting))

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            trace.append(("batch_start", batch_idx, trainer.global_step, trainer.fit_loop.restarting))

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            trace.append(("epoch_end", trainer.current_epoch, trainer.fit_loop.restarting))

    class SaveInsideEpoch(pl.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if trainer.current_epoch == 1 and batch_idx == 1:
                trainer.save_checkpoint(root / "inside.ckpt")

    def fit(max_epochs: int, ckpt_path: Path | None = None, *extra: Any) -> list[tuple[Any, ...]]:
        trace.clear()
        trainer = _trainer(trainer_class, root, max_epochs=max_epochs, limit_train_batches=3, limit_val_batches=1,
                           callbacks=[Spy(), *extra])
        trainer.fit(BoringModel(), ckpt_path=ckpt_path)
        if ckpt_path is None:
            trainer.save_checkpoint(root / "after_fit.ckpt")
        return list(trace)

    return {"fresh": fit(2, None, SaveInsideEpoch()), "after_fit": fit(3, root / "after_fit.ckpt"),
            "inside_epoch": fit(3, root / "inside.ckpt")}


def test_fit_loop_restarting_matches_lightning(tmp_path: Path) -> None:
    """True from a checkpoint written inside an epoch until that epoch ends; False otherwise."""
    import pytorch_lightning as pl

    theirs, ours = _restarting_trace(pl.Trainer, tmp_path / "lightning"), _restarting_trace(Trainer, tmp_path / "ours")
    assert ours == theirs
    assert ("epoch_end", 1, True) in ours["inside_epoch"] and ("epoch_start", 2, False) in ours["inside_epoch"]


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_evaluating_without_a_model_after_fit_uses_the_best_checkpoint_and_says_so(
        trainer_class: Any, tmp_path: Path, stage: str) -> None:
    """Lightning's rule (and a warning, in each framework's words): after fit, `test()` with neither a
    model nor ckpt_path loads the best checkpoint of that fit; with the model, its own weights."""
    from pytorch_lightning.demos.boring_classes import BoringModel

    trainer = trainer_class(default_root_dir=tmp_path, accelerator="cpu", devices=1, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, max_epochs=2, limit_train_batches=2,
                            limit_val_batches=1, limit_test_batches=1, limit_predict_batches=1)
    model = BoringModel()
    trainer.fit(model)
    with pytest.warns(UserWarning, match="best"):
        getattr(trainer, stage)()
    assert trainer.ckpt_path == trainer.checkpoint_callback.best_model_path
    getattr(trainer, stage)(model)
    assert trainer.ckpt_path is None
