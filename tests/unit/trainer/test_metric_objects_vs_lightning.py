"""torchmetrics objects logged with `self.log`, under Lightning's Trainer and ours: when the
Trainer resets them, and what the epoch-end hooks can still compute."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

pl = pytest.importorskip("lightning.pytorch")
torchmetrics = pytest.importorskip("torchmetrics")
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset  # noqa: E402

from trainer import Trainer  # noqa: E402

_STAGES = ("fit", "validate", "test")  # the metric of training steps is "fit" (ModuleDict has .train)


class _CountedMean(torchmetrics.MeanMetric):
    """A mean that counts the resets done to it (it is only ever updated, never called, so every
    reset comes from the Trainer)."""

    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    def reset(self) -> None:
        super().reset()
        self.resets = getattr(self, "resets", 0) + 1


class _MetricModule(BoringModel):
    """One mean per stage, updated and logged in each step; the epoch-end and stage-end hooks
    record what the metric computes there (so a reset before them would show)."""

    def __init__(self) -> None:
        super().__init__()
        self.means = torch.nn.ModuleDict({stage: _CountedMean() for stage in _STAGES})
        self.seen: dict[str, list[float]] = {}

    def _update_and_log(self, stage: str, batch: Any) -> None:
        self.means[stage].update(batch.sum())
        self.log(f"mean_{stage}", self.means[stage], on_step=False, on_epoch=True)

    def _record(self, hook: str, stage: str) -> None:
        if self.trainer.sanity_checking:
            return
        with warnings.catch_warnings():  # torchmetrics warns on compute() of a reset metric
            warnings.simplefilter("ignore")
            value = float(self.means[stage].compute())
        self.seen.setdefault(hook, []).append(round(value, 4))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self._update_and_log("fit", batch)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        if not self.trainer.sanity_checking:
            self._update_and_log("validate", batch)
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        self._update_and_log("test", batch)
        return super().test_step(batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        self._record("on_train_epoch_end", "fit")

    def on_validation_epoch_end(self) -> None:
        self._record("on_validation_epoch_end", "validate")

    def on_validation_end(self) -> None:
        self._record("on_validation_end", "validate")

    def on_test_end(self) -> None:
        self._record("on_test_end", "test")

    def train_dataloader(self) -> Any:
        return DataLoader(RandomDataset(32, 8), batch_size=2)

    val_dataloader = test_dataloader = train_dataloader


def _resets_and_values(trainer_class: Any, root: Path) -> dict[str, Any]:
    pl.seed_everything(3)
    module = _MetricModule()
    trainer = trainer_class(default_root_dir=root, max_epochs=2, limit_train_batches=3, limit_val_batches=2,
                            limit_test_batches=2, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False)
    found: dict[str, Any] = {}
    start = Counter({stage: module.means[stage].resets for stage in _STAGES})
    trainer.fit(module)
    found["fit"] = {stage: module.means[stage].resets - start[stage] for stage in _STAGES}
    trainer.validate(module, verbose=False)
    found["validate"] = {stage: module.means[stage].resets - start[stage] for stage in _STAGES}
    trainer.test(module, verbose=False)
    found["test"] = {stage: module.means[stage].resets - start[stage] for stage in _STAGES}
    found["computed in hooks"] = module.seen
    return found


def test_metric_objects_are_reset_once_per_epoch_where_lightning_resets_them(tmp_path: Path) -> None:
    lightning = _resets_and_values(pl.Trainer, tmp_path / "lightning")
    ours = _resets_and_values(Trainer, tmp_path / "ours")
    assert ours == lightning
    assert ours["fit"] == {"fit": 2, "validate": 2, "test": 0}  # once per epoch, not twice
    assert ours["test"] == {"fit": 2, "validate": 3, "test": 1}
    # still computable in the epoch-end hooks and in on_validation_end/on_test_end: reset after them
    assert all(value == value for values in ours["computed in hooks"].values() for value in values)  # no NaN

