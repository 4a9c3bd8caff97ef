"""Checks of step signatures, of `optimizer_step` running its closure, and `configure_optimizers` returning None, against Lightning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402

from trainer import Trainer  # noqa: E402

_TRAINERS = {"lightning": pl.Trainer, "ours": Trainer}


def _trainer(side: str, tmp_path: Path, **kwargs: Any) -> Any:
    settings = dict(accelerator="cpu", default_root_dir=tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=2,
                    logger=False,
                    enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    return _TRAINERS[side](**{**settings, **kwargs})


class _RequiresDataloaderIdx(BoringModel):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        pass


class _DefaultDataloaderIdx(BoringModel):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.seen = dataloader_idx


class _OptimizerIdx(BoringModel):
    def training_step(self, batch: Any, batch_idx: int, optimizer_idx: int) -> Any:
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("side", _TRAINERS)
def test_required_dataloader_idx_with_one_loader_fails_before_the_first_batch(tmp_path: Path, side: str) -> None:
    with pytest.raises(RuntimeError, match="dataloader_idx"):
        _trainer(side, tmp_path).validate(_RequiresDataloaderIdx(), verbose=False)
    model = _DefaultDataloaderIdx()
    _trainer(side, tmp_path).validate(model, verbose=False)
    assert model.seen == 0


@pytest.mark.parametrize("side", _TRAINERS)
def test_optimizer_idx_in_automatic_optimization_is_refused(tmp_path: Path, side: str) -> None:
    with pytest.raises(RuntimeError, match="optimizer_idx"):
        _trainer(side, tmp_path).fit(_OptimizerIdx())


class _NoOptimizers(BoringModel):
    def configure_optimizers(self) -> None:
        return None


def test_no_optimizer_runs_the_steps_and_updates_nothing(tmp_path: Path) -> None:
    outcomes = {}
    for side in _TRAINERS:
        model = _NoOptimizers()
        before = model.layer.weight.detach().clone()
        with pytest.warns(UserWarning, match="None"):
            trainer = _trainer(side, tmp_path / side, limit_val_batches=0)
            trainer.fit(model)
        outcomes[side] = (trainer.global_step, torch.equal(before, model.layer.weight))
    assert outcomes["ours"] == outcomes["lightning"]
    assert outcomes["ours"][1]  # nothing updated


class _ForgetsTheClosure(BoringModel):
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step()  # the closure (training_step, backward) is never run


@pytest.mark.parametrize("side", _TRAINERS)
def test_an_optimizer_step_that_skips_the_closure_is_an_error(tmp_path: Path, side: str) -> None:
    with pytest.raises(Exception, match="closure"):
        _trainer(side, tmp_path).fit(_ForgetsTheClosure())


def test_setup_receives_the_stage_as_lightning_passes_it(tmp_path: Path) -> None:
    seen = {}

    class RecordsStage(BoringModel):
        def setup(self, stage: Any) -> None:
            seen["value"], seen["equal"] = stage.value, stage == "fit"

    _trainer("ours", tmp_path).fit(RecordsStage())
    assert seen == {"value": "fit", "equal": True}


def test_gpu_is_lightnings_name_for_the_gpu() -> None:
    from strategies.base import resolve_accelerator

    if torch.cuda.is_available():
        assert resolve_accelerator("gpu") == "cuda"
    else:
        with pytest.raises(RuntimeError, match="cuda"):
            resolve_accelerator("gpu")


class _ManualReturnsANumber(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return 5


@pytest.mark.parametrize("side", _TRAINERS)
def test_manual_optimization_refuses_a_step_output_of_another_kind(tmp_path: Path, side: str) -> None:
    with pytest.raises(Exception, match="(?i)manual optimization"):
        _trainer(side, tmp_path).fit(_ManualReturnsANumber())
