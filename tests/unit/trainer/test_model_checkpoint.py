from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from strategies.checkpoint_io import TorchCheckpointIO
from tests.helpers.fake_trainer import BroadcastChannel, FakeTrainer, RecordingLogger
from trainer.callbacks.checkpoint_files import resolve_last_checkpoint
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.callbacks.save_schedule import run_on_train_epoch_end


def _files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("*.ckpt"))


def _fit(tmp_path: Path, callback: ModelCheckpoint, losses: list[float]) -> FakeTrainer:
    trainer = FakeTrainer(tmp_path, callbacks=[callback], num_training_batches=2)
    trainer.fit(len(losses), val_metrics=lambda epoch: {"val_loss": losses[epoch]})
    return trainer


# ---------------------------------------------------------------------- names
def test_filename_template_inserts_metric_names() -> None:
    callback = ModelCheckpoint(dirpath="/ckpts", filename="{epoch}-{step}-{val_acc:.3f}")
    metrics = {"epoch": 3, "step": 120, "val_acc": torch.tensor(0.97)}
    assert callback.format_checkpoint_name(metrics) == "/ckpts/epoch=3-step=120-val_acc=0.970.ckpt"
    assert callback.format_checkpoint_name(metrics, ver=2) == "/ckpts/epoch=3-step=120-val_acc=0.970-v2.ckpt"


def test_filename_template_without_auto_insert_and_defaults() -> None:
    plain = ModelCheckpoint(dirpath="/c", filename="best-{epoch:02d}-{val_acc:.2f}", auto_insert_metric_name=False)
    assert plain.format_checkpoint_name({"epoch": 4, "val_acc": 0.5}) == "/c/best-04-0.50.ckpt"
    default = ModelCheckpoint(dirpath="/c")
    assert default.format_checkpoint_name({"epoch": 1, "step": 7}) == "/c/epoch=1-step=7.ckpt"
    # a key that is not logged formats as 0 (Lightning), and longer keys win over their prefixes
    both = ModelCheckpoint(dirpath="/c", filename="{epoch}-{epoch_test}")
    assert both.format_checkpoint_name({"epoch": 2}) == "/c/epoch=2-epoch_test=0.ckpt"


def test_default_dirpath_follows_logger_then_root(tmp_path: Path) -> None:
    from trainer.loggers import TensorBoardLogger

    with_logger = FakeTrainer(tmp_path, loggers=[TensorBoardLogger(tmp_path / "tb")])
    callback = ModelCheckpoint()
    callback.setup(with_logger, None, "fit")
    assert callback.dirpath == os.path.join(tmp_path, "tb", "lightning_logs", "version_0", "checkpoints")

    without = ModelCheckpoint()
    without.setup(FakeTrainer(tmp_path), None, "fit")
    assert without.dirpath == os.path.join(tmp_path, "checkpoints")


# ---------------------------------------------------------------------- top-k
def test_top_k_rotation_keeps_the_k_best_files(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{val_loss:.1f}", monitor="val_loss", save_top_k=2)
    trainer = _fit(tmp_path, callback, [5.0, 3.0, 4.0, 1.0, 6.0])

    assert _files(tmp_path) == ["epoch=1-val_loss=3.0.ckpt", "epoch=3-val_loss=1.0.ckpt"]
    assert callback.best_model_path == str(tmp_path / "epoch=3-val_loss=1.0.ckpt")
    assert float(callback.best_model_score) == 1.0
    assert callback.kth_best_model_path == str(tmp_path / "epoch=1-val_loss=3.0.ckpt")
    assert float(callback.kth_value) == 3.0
    assert {Path(p).name: float(v) for p, v in callback.best_k_models.items()} == {
        "epoch=1-val_loss=3.0.ckpt": 3.0, "epoch=3-val_loss=1.0.ckpt": 1.0}
    # epochs 0, 1, 2 (replaces 0) and 3 (replaces 2) saved; epoch 4 was worse than the kth
    assert [Path(p).name[:7] for p, _ in trainer.saved] == ["epoch=0", "epoch=1", "epoch=2", "epoch=3"]
    assert [Path(p).name[:7] for p in trainer.strategy.removed] == ["epoch=0", "epoch=2"]


def test_mode_max_keeps_the_highest(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", mode="max", save_top_k=1)
    _fit(tmp_path, callback, [0.2, 0.9, 0.5])
    assert _files(tmp_path) == ["epoch=1-step=4.ckpt"]
    assert float(callback.best_model_score) == pytest.approx(0.9)


def test_save_top_k_minus_one_keeps_all_and_zero_saves_none(tmp_path: Path) -> None:
    keep_all = ModelCheckpoint(dirpath=tmp_path / "all", monitor="val_loss", save_top_k=-1)
    _fit(tmp_path, keep_all, [3.0, 2.0, 4.0])
    assert len(_files(tmp_path / "all")) == 3
    assert Path(keep_all.best_model_path).name == "epoch=1-step=4.ckpt"

    none = ModelCheckpoint(dirpath=tmp_path / "none", monitor="val_loss", save_top_k=0)
    _fit(tmp_path, none, [3.0, 2.0])
    assert not (tmp_path / "none").exists()
    assert none.best_model_path == ""


def test_nan_score_never_beats_a_real_one(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1)
    _fit(tmp_path, callback, [float("nan"), 2.0, float("nan")])
    assert _files(tmp_path) == ["epoch=1-step=4.ckpt"]


def test_save_last_alongside_top_k_and_alone(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path / "a", monitor="val_loss", save_last=True)
    _fit(tmp_path, callback, [3.0, 2.0, 4.0])
    assert _files(tmp_path / "a") == ["epoch=1-step=4.ckpt", "last.ckpt"]
    assert callback.last_model_path == str(tmp_path / "a" / "last.ckpt")
    saved = TorchCheckpointIO().load(callback.last_model_path)  # weights_only=True load must accept the state
    # Lightning's rule (checked against its Trainer): at epoch end, last.ckpt follows only a top-k save,
    # so the worse epoch 2 leaves it at epoch 1
    assert saved["epoch"] == 1
    state = saved["callbacks"][callback.state_key]
    assert state["best_model_path"] == callback.best_model_path and float(state["best_model_score"]) == 2.0

    only_last = ModelCheckpoint(dirpath=tmp_path / "b", save_top_k=0, save_last=True)
    _fit(tmp_path, only_last, [1.0, 1.0])
    assert _files(tmp_path / "b") == ["last.ckpt"]


def test_no_monitor_keeps_only_the_latest(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path)
    _fit(tmp_path, callback, [1.0, 1.0, 1.0])
    assert _files(tmp_path) == ["epoch=2-step=6.ckpt"]
    assert Path(callback.best_model_path).name == "epoch=2-step=6.ckpt"


def test_existing_names_get_a_version_suffix(tmp_path: Path) -> None:
    (tmp_path / "epoch=0-step=2.ckpt").write_bytes(b"from another run")
    callback = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)
    _fit(tmp_path, callback, [1.0])
    assert _files(tmp_path) == ["epoch=0-step=2-v1.ckpt", "epoch=0-step=2.ckpt"]
    assert (tmp_path / "epoch=0-step=2.ckpt").read_bytes() == b"from another run"


# ---------------------------------------------------------------------- triggers
def test_every_n_train_steps_saves_on_those_steps(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    trainer = FakeTrainer(tmp_path, callbacks=[callback], num_training_batches=4)
    trainer.fit(2, val_metrics=lambda epoch: {"val_loss": 1.0})
    assert _files(tmp_path) == ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt"]


def test_every_n_epochs(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=2, save_top_k=-1)
    _fit(tmp_path, callback, [1.0] * 5)
    assert _files(tmp_path) == ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]


def test_saves_at_train_epoch_end_without_validation(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="train_loss")
    trainer = FakeTrainer(tmp_path, callbacks=[callback], num_training_batches=2, num_val_batches=[])
    trainer.fit(2, train_metrics=lambda step: {"train_loss": 10.0 - step})
    assert _files(tmp_path) == ["epoch=1-step=4.ckpt"]
    assert run_on_train_epoch_end(trainer, None)
    assert not run_on_train_epoch_end(FakeTrainer(tmp_path), False)


@pytest.mark.parametrize("setting", [{"val_check_interval": 0.5}, {"check_val_every_n_epoch": 2}])
def test_saves_right_after_validation_unless_it_runs_once_per_epoch(tmp_path: Path, setting: dict[str, float]) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss")
    trainer = FakeTrainer(tmp_path, callbacks=[callback])
    for key, value in setting.items():
        setattr(trainer, key, value)
    trainer.call("setup", "fit")
    trainer.global_step = 2
    trainer.callback_metrics = {"val_loss": torch.tensor(1.0)}
    trainer.call("on_validation_end")
    assert _files(tmp_path) == ["epoch=0-step=2.ckpt"]
    trainer.call("on_train_epoch_end")  # nothing more at epoch end
    assert len(trainer.saved) == 1


def test_no_saving_outside_fit_or_in_fast_dev_run(tmp_path: Path) -> None:
    trainer = FakeTrainer(tmp_path, callbacks=[ModelCheckpoint(dirpath=tmp_path)])
    trainer.fit(1, val_metrics=lambda epoch: {"val_loss": 1.0}, stage="validate")
    fast = FakeTrainer(tmp_path, callbacks=[ModelCheckpoint(dirpath=tmp_path)])
    fast.fast_dev_run = True
    fast.fit(1, val_metrics=lambda epoch: {"val_loss": 1.0})
    assert _files(tmp_path) == [] and trainer.saved == [] and fast.saved == []


# ---------------------------------------------------------------------- errors
def test_missing_monitor_names_the_key_and_the_available_ones(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_acc")
    with pytest.raises(KeyError, match=r"val_acc.*available: \['epoch', 'step', 'val_loss'\]"):
        _fit(tmp_path, callback, [1.0])


def test_missing_monitor_before_first_validation_only_warns(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", every_n_train_steps=1)
    trainer = FakeTrainer(tmp_path, callbacks=[callback], num_training_batches=1)
    with pytest.warns(RuntimeWarning, match="val_loss"):
        trainer.fit(2, val_metrics=lambda epoch: {"val_loss": 2.0 - epoch})
    assert _files(tmp_path) == ["epoch=1-step=2.ckpt"]  # step 2 runs after epoch 0's validation


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "avg"}, "mode='avg'"),
    ({"save_top_k": -2}, "save_top_k=-2"),
    ({"save_top_k": 3}, "monitor=None"),
    ({"every_n_train_steps": 2, "every_n_epochs": 1}, "mutually exclusive"),
    ({"every_n_epochs": -1}, "every_n_epochs=-1"),
    ({"save_last": "copy"}, "save_last='copy'"),
])
def test_bad_arguments_raise_value_error(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelCheckpoint(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- state and ranks
def test_state_dict_round_trip_keeps_top_k_across_resume(tmp_path: Path) -> None:
    first = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2)
    trainer = _fit(tmp_path, first, [5.0, 3.0])
    saved = TorchCheckpointIO().load(tmp_path / "epoch=1-step=4.ckpt")

    resumed = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2)
    resumed.load_state_dict(saved["callbacks"][resumed.state_key])
    assert resumed.best_k_models.keys() == first.best_k_models.keys()
    second = FakeTrainer(tmp_path, callbacks=[resumed], num_training_batches=2)
    second.global_step, epochs = trainer.global_step, iter([4.0, 1.0])
    second.fit(2, val_metrics=lambda epoch: {"val_loss": next(epochs)})
    # 4.0 replaced 5.0 (epoch 0's file), then 1.0 replaced 4.0
    assert [float(v) for v in sorted(resumed.best_k_models.values())] == [1.0, 3.0]
    assert len(_files(tmp_path)) == 2


def test_changed_dirpath_restores_only_best_model_path(tmp_path: Path) -> None:
    old = ModelCheckpoint(dirpath=tmp_path / "old", monitor="val_loss")
    _fit(tmp_path, old, [1.0])
    new = ModelCheckpoint(dirpath=tmp_path / "new", monitor="val_loss")
    with pytest.warns(UserWarning, match="dirpath changed"):
        new.load_state_dict(old.state_dict())
    assert new.best_model_path == old.best_model_path and new.best_k_models == {}


def test_rank_one_follows_rank_zero_and_writes_nothing(tmp_path: Path) -> None:
    channel = BroadcastChannel()
    callbacks = [ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1, save_last=True) for _ in range(2)]
    ranks = [FakeTrainer(tmp_path, global_rank=rank, world_size=2, channel=channel, callbacks=[callbacks[rank]],
                         num_training_batches=1) for rank in range(2)]
    for rank in ranks:
        rank.call("setup", "fit")
    # rank 1 sees different (unsynced) metrics; rank 0's decision must win on both ranks
    for epoch, (loss0, loss1) in enumerate([(3.0, 1.0), (2.0, 9.0), (5.0, 0.1)]):
        for rank, loss in zip(ranks, (loss0, loss1)):
            rank.current_epoch, rank.global_step = epoch, epoch + 1
            rank.callback_metrics = {"val_loss": torch.tensor(loss)}
            rank.call("on_validation_end")
            rank.call("on_train_epoch_end")
    assert ranks[0].saved == ranks[1].saved  # the same collective calls, in the same order
    assert ranks[0].strategy.removed == ranks[1].strategy.removed
    assert callbacks[0].state_dict().keys() == callbacks[1].state_dict().keys()
    assert callbacks[1].best_model_path == callbacks[0].best_model_path == str(tmp_path / "epoch=1-step=2.ckpt")
    assert float(callbacks[1].best_model_score) == 2.0
    assert _files(tmp_path) == ["epoch=1-step=2.ckpt", "last.ckpt"]


def test_rank_one_alone_creates_no_files(tmp_path: Path) -> None:
    rank_zero_view = ModelCheckpoint(dirpath=tmp_path / "ckpts")
    target = os.path.join(rank_zero_view.dirpath, "x.ckpt")
    channel = BroadcastChannel()  # what rank 0 broadcasts: the dirpath in setup, then one save plan
    channel.sent += [rank_zero_view.dirpath,
                     {"save": [target], "remove": [], "state": rank_zero_view.state_dict(), "message": None,
                      "newest": target}]
    trainer = FakeTrainer(tmp_path, global_rank=1, world_size=2, channel=channel,
                          callbacks=[ModelCheckpoint(save_last=True)], num_training_batches=1,
                          loggers=[RecordingLogger()])
    trainer.fit(1, val_metrics=lambda epoch: {"val_loss": 1.0})
    assert trainer.saved == [(target, False)]
    assert list(tmp_path.rglob("*")) == []


# ---------------------------------------------------------------------- resolve "last"
def test_resolve_last_checkpoint_picks_the_newest(tmp_path: Path) -> None:
    assert resolve_last_checkpoint(tmp_path / "missing") is None
    assert resolve_last_checkpoint(tmp_path) is None
    now = time.time()
    for offset, name in [(0, "last.ckpt"), (-10, "epoch=0-step=2.ckpt"), (5, "epoch=1-step=4.ckpt")]:
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (now + offset, now + offset))
    (tmp_path / ".last.ckpt.abc.tmp").write_bytes(b"partial")
    assert resolve_last_checkpoint(tmp_path) == str(tmp_path / "epoch=1-step=4.ckpt")
    os.utime(tmp_path / "last.ckpt", (now + 5, now + 5))  # a tie goes to last.ckpt
    assert resolve_last_checkpoint(tmp_path) == str(tmp_path / "last.ckpt")
