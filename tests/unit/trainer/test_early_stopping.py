from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from strategies.checkpoint_io import TorchCheckpointIO
from tests.helpers.fake_trainer import BroadcastChannel, FakeTrainer
from trainer.callbacks import EarlyStopping


def _fit(tmp_path: Path, callback: EarlyStopping, values: list[float], key: str = "val_loss") -> FakeTrainer:
    trainer = FakeTrainer(tmp_path, callbacks=[callback], num_training_batches=1)
    trainer.fit(len(values), val_metrics=lambda epoch: {key: values[epoch]})
    return trainer


def test_patience_counts_checks_without_improvement(tmp_path: Path) -> None:
    callback = EarlyStopping(monitor="val_loss", patience=2)
    trainer = _fit(tmp_path, callback, [3.0, 2.0, 2.5, 2.4, 1.0, 0.5])
    assert trainer.should_stop and trainer.current_epoch == 3
    assert callback.stopped_epoch == 3 and callback.wait_count == 2
    assert float(callback.best_score) == 2.0


def test_improvement_resets_the_wait(tmp_path: Path) -> None:
    callback = EarlyStopping(monitor="val_loss", patience=2)
    trainer = _fit(tmp_path, callback, [3.0, 3.5, 2.0, 2.5, 1.0])
    assert not trainer.should_stop and callback.stopped_epoch == 0
    assert float(callback.best_score) == 1.0 and callback.wait_count == 0


def test_min_delta_demands_a_large_enough_gain(tmp_path: Path) -> None:
    callback = EarlyStopping(monitor="val_loss", patience=2, min_delta=0.5)
    trainer = _fit(tmp_path, callback, [3.0, 2.7, 2.6, 1.0])  # 0.3 and 0.4 gains do not count
    assert trainer.should_stop and callback.stopped_epoch == 2
    assert float(callback.best_score) == 3.0


def test_mode_max(tmp_path: Path) -> None:
    callback = EarlyStopping(monitor="val_acc", mode="max", patience=1)
    trainer = _fit(tmp_path, callback, [0.5, 0.7, 0.6, 0.9], key="val_acc")
    assert trainer.should_stop and callback.stopped_epoch == 2
    assert float(callback.best_score) == pytest.approx(0.7)


def test_stopping_threshold_stops_when_good_enough(tmp_path: Path) -> None:
    callback = EarlyStopping(monitor="val_loss", patience=10, stopping_threshold=0.1, verbose=True)
    trainer = _fit(tmp_path, callback, [1.0, 0.5, 0.05, 0.01])
    assert trainer.should_stop and callback.stopped_epoch == 2
    assert "Stopping threshold reached: val_loss = 0.05" in trainer.printed[-1]


def test_divergence_threshold_stops_when_hopeless(tmp_path: Path) -> None:
    callback = EarlyStopping(monitor="val_loss", patience=10, divergence_threshold=5.0, verbose=True)
    trainer = _fit(tmp_path, callback, [1.0, 4.0, 6.0, 0.5])
    assert trainer.should_stop and callback.stopped_epoch == 2
    assert "Divergence threshold reached: val_loss = 6.0 > 5.0" in trainer.printed[-1]


def test_non_finite_metric_stops_unless_disabled(tmp_path: Path) -> None:
    assert _fit(tmp_path, EarlyStopping(monitor="val_loss"), [1.0, math.nan, 0.5]).current_epoch == 1
    lenient = EarlyStopping(monitor="val_loss", check_finite=False, patience=5)
    assert not _fit(tmp_path, lenient, [1.0, math.inf, 0.5]).should_stop


def test_missing_metric_is_an_error_when_strict(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"monitor='val_acc'.*available: \['val_loss'\]"):
        _fit(tmp_path, EarlyStopping(monitor="val_acc"), [1.0])
    assert not _fit(tmp_path, EarlyStopping(monitor="val_acc", strict=False), [1.0, 1.0]).should_stop


def test_checks_on_train_epoch_end_without_validation(tmp_path: Path) -> None:
    callback = EarlyStopping(monitor="train_loss", patience=1)
    trainer = FakeTrainer(tmp_path, callbacks=[callback], num_training_batches=1, num_val_batches=[])
    trainer.fit(5, train_metrics=lambda step: {"train_loss": 1.0})
    assert trainer.should_stop and callback.stopped_epoch == 1


def test_no_check_outside_fit_or_in_fast_dev_run(tmp_path: Path) -> None:
    trainer = FakeTrainer(tmp_path, callbacks=[EarlyStopping(monitor="val_loss", patience=0)], num_training_batches=1)
    trainer.fit(2, val_metrics=lambda epoch: {"val_loss": 1.0}, stage="validate")
    assert not trainer.should_stop
    fast = FakeTrainer(tmp_path, callbacks=[EarlyStopping(monitor="val_loss", patience=0)], num_training_batches=1)
    fast.fast_dev_run = True
    fast.fit(2, val_metrics=lambda epoch: {"val_loss": 1.0})
    assert not fast.should_stop


def test_state_dict_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    callback = EarlyStopping(monitor="val_loss", patience=3)
    trainer = _fit(tmp_path, callback, [2.0, 1.0, 1.5])
    trainer.save_checkpoint(str(tmp_path / "es.ckpt"))
    state = TorchCheckpointIO().load(tmp_path / "es.ckpt")["callbacks"][callback.state_key]
    resumed = EarlyStopping(monitor="val_loss", patience=3)
    resumed.load_state_dict(state)
    assert (resumed.wait_count, float(resumed.best_score), resumed.patience) == (1, 1.0, 3)
    assert resumed.state_key == "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"


def test_rank_zero_decides_for_every_rank(tmp_path: Path) -> None:
    channel = BroadcastChannel()
    callbacks = [EarlyStopping(monitor="val_loss", patience=1) for _ in range(2)]
    ranks = [FakeTrainer(tmp_path, global_rank=r, world_size=2, channel=channel, callbacks=[callbacks[r]])
             for r in range(2)]
    for trainer in ranks:
        trainer.call("setup", "fit")
    for epoch, (loss0, loss1) in enumerate([(1.0, 5.0), (2.0, 0.1)]):  # rank 1 alone would keep going
        for trainer, loss in zip(ranks, (loss0, loss1)):
            trainer.current_epoch = epoch
            trainer.callback_metrics = {"val_loss": torch.tensor(loss)}
            trainer.call("on_validation_end")
            trainer.call("on_train_epoch_end")
    assert ranks[0].should_stop and ranks[1].should_stop
    assert callbacks[1].state_dict() == callbacks[0].state_dict()


@pytest.mark.parametrize("kwargs, error", [
    ({"monitor": "x", "mode": "avg"}, ValueError),
    ({"monitor": "x", "patience": -1}, ValueError),
    ({"monitor": None}, TypeError),
])
def test_bad_arguments(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error, match="EarlyStopping"):
        EarlyStopping(**kwargs)  # type: ignore[arg-type]
