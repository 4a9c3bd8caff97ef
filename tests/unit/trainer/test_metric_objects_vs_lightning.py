"""torchmetrics objects logged with `self.log`/`self.log_dict`, under Lightning's Trainer and ours:
when the Trainer resets them, what the epoch-end hooks can still compute, and how a
MetricCollection's items are taken."""

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


class _CollectionModule(BoringModel):
    """Logs a MetricCollection with log_dict, recording how the Trainer asks for its items."""

    def __init__(self, compute_groups: bool) -> None:
        super().__init__()
        from torchmetrics.classification import MulticlassAccuracy, MulticlassPrecision

        calls = self.item_calls = []  # (keep_base, copy_state) of each items() call made while logging

        class Recording(torchmetrics.MetricCollection):
            logging = False

            def items(self, keep_base: bool = False, copy_state: bool = True) -> Any:
                if self.logging:
                    calls.append((keep_base, copy_state))
                return super().items(keep_base=keep_base, copy_state=copy_state)

        self.metrics = Recording([MulticlassAccuracy(num_classes=4, average="micro"),
                                  MulticlassPrecision(num_classes=4, average="micro")],
                                 compute_groups=compute_groups, prefix="train_")

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        generator = torch.Generator().manual_seed(batch_idx)
        self.metrics(torch.rand(8, 4, generator=generator), torch.randint(0, 4, (8,), generator=generator))
        self.metrics.logging = True
        self.log_dict(self.metrics, on_step=True, on_epoch=True)
        self.metrics.logging = False
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("compute_groups", [True, False])
def test_metric_collection_items_are_taken_as_lightning_takes_them(tmp_path: Path, compute_groups: bool) -> None:
    """Lightning takes a MetricCollection's items without its base names and, with compute groups,
    by reference (copy_state=False); the logged values are the same either way."""
    found = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        module = _CollectionModule(compute_groups)
        trainer = trainer_class(default_root_dir=tmp_path / name, max_epochs=1, limit_train_batches=3,
                                limit_val_batches=0, logger=False, enable_progress_bar=False,
                                enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(module)
        found[name] = (module.item_calls, {key: round(float(value), 4) for key, value in trainer.callback_metrics.items()})
    assert found["ours"] == found["lightning"]
    assert set(found["ours"][0]) == {(False, not compute_groups)}


def _fit_logging(trainer_class: Any, root: Path, logger: Any, log_kwargs: dict[str, Any]) -> tuple[Any, list[str]]:
    class Logging(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("value", float(batch_idx), **log_kwargs)
            return super().training_step(batch, batch_idx)

    trainer = trainer_class(default_root_dir=root, max_epochs=1, limit_train_batches=2, limit_val_batches=0,
                            logger=logger, enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False, log_every_n_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Logging())
    about_logger = [str(w.message) for w in caught if "'value'" in str(w.message) and "logger" in str(w.message)]
    return trainer, about_logger


@pytest.mark.parametrize("log_kwargs", [{"logger": True}, {"logger": None}, {}, {"logger": False}],
                         ids=["logger=True", "logger=None", "default", "logger=False"])
@pytest.mark.parametrize("with_logger", [False, True])
def test_logger_true_without_a_logger_warns_as_in_lightning(tmp_path: Path, log_kwargs: dict[str, Any],
                                                            with_logger: bool) -> None:
    """Lightning warns when self.log asks for the logger explicitly and the Trainer has none; the
    default (logger=None) sends the value to the logger without a word."""
    from lightning.pytorch.loggers import CSVLogger

    results = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        logger = CSVLogger(tmp_path / name) if with_logger else False
        trainer, warned = _fit_logging(trainer_class, tmp_path / name, logger, log_kwargs)
        results[name] = (bool(warned), sorted(trainer.logged_metrics))
    assert results["ours"] == results["lightning"]
    assert results["ours"][0] == (log_kwargs.get("logger") is True and not with_logger)
