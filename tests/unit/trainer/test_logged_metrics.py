"""self.log semantics: Lightning's per-hook defaults, epoch aggregation and key names."""

from __future__ import annotations

import pytest
import torch

from trainer.logged_metrics import MetricStore


def _store() -> MetricStore:
    return MetricStore(lambda tensor, reduce_op: tensor)


def test_training_step_logs_per_step_by_default() -> None:
    store = _store()
    store.log("training_step", "loss", torch.tensor(2.0))
    assert store.pop_logger_metrics() == {"loss": 2.0}
    store.compute_epoch("train")
    assert store.pop_logger_metrics() == {}


def test_validation_is_weighted_mean_per_epoch() -> None:
    store = _store()
    store.log("validation_step", "val_loss", 1.0, batch_size=1)
    store.log("validation_step", "val_loss", 4.0, batch_size=3)
    assert store.pop_logger_metrics() == {}
    store.compute_epoch("validate")
    assert store.pop_logger_metrics() == {"val_loss": pytest.approx(3.25)}
    assert float(store.callback_metrics["val_loss"]) == pytest.approx(3.25)
    assert store.epoch_keys("validate") == ["val_loss"]


def test_step_and_epoch_keys() -> None:
    store = _store()
    for value in (1.0, 3.0):
        store.current_batch_size = 2
        store.log("training_step", "acc", value, on_step=True, on_epoch=True, prog_bar=True)
    assert store.pop_logger_metrics() == {"acc_step": 3.0}
    store.compute_epoch("train")
    assert store.pop_logger_metrics() == {"acc_epoch": 2.0}
    # Lightning's progress bar shows both forks under their own names; `acc` holds the latest
    assert float(store.callback_metrics["acc"]) == 2.0 and store.progress_bar_metrics["acc_epoch"] == 2.0
    assert store.progress_bar_metrics["acc_step"] == 3.0


@pytest.mark.parametrize(("reduce_fx", "expected"), [("max", 5.0), ("min", 1.0), ("sum", 9.0), (torch.max, 5.0)])
def test_reduce_fx(reduce_fx: object, expected: float) -> None:
    store = _store()
    for value in (1.0, 5.0, 3.0):
        store.log("validation_step", "m", value, reduce_fx=reduce_fx)
    store.compute_epoch("validate")
    assert float(store.callback_metrics["m"]) == expected


def test_sync_dist_reduces_sum_and_weight_in_one_collective() -> None:
    calls = []

    def fake_reduce(tensor: torch.Tensor, reduce_op: str) -> torch.Tensor:
        calls.append(reduce_op)
        return tensor * 2  # two identical ranks
    store = MetricStore(fake_reduce)
    store.log("validation_step", "v", 3.0, sync_dist=True, batch_size=4)
    store.compute_epoch("validate")
    assert calls == ["sum"] and float(store.callback_metrics["v"]) == 3.0  # (sum, weight) stacked


def test_torchmetrics_metric_is_computed_and_reset_at_epoch_end() -> None:
    from torchmetrics.classification import MulticlassAccuracy

    store = _store()
    metric = MulticlassAccuracy(num_classes=2, average="micro")
    metric(torch.tensor([0, 1]), torch.tensor([0, 0]))
    store.log("validation_step", "acc", metric)
    metric(torch.tensor([1, 1]), torch.tensor([1, 1]))
    store.log("validation_step", "acc", metric)
    store.compute_epoch("validate")
    assert float(store.callback_metrics["acc"]) == pytest.approx(0.75)
    assert float(metric.compute()) == pytest.approx(0.75)  # on_validation_epoch_end may still compute it
    store.reset_metric_objects("validate")
    assert metric.update_count == 0  # reset for the next epoch, after the epoch-end hooks


@pytest.mark.parametrize(("value", "error"), [(torch.ones(3), ValueError), ("high", ValueError), ({"a": 1.0}, ValueError),
                                              (None, ValueError)])
def test_bad_values_are_refused(value: object, error: type) -> None:
    with pytest.raises(error, match="self.log"):
        _store().log("training_step", "x", value)


def test_bad_reduce_fx() -> None:
    with pytest.raises(ValueError, match="reduce_fx"):
        _store().log("training_step", "x", 1.0, reduce_fx="median")
