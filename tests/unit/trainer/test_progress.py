from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.fake_trainer import BroadcastChannel, FakeTrainer, RecordingLogger
from trainer import Trainer
from trainer.callbacks import TQDMProgressBar


@pytest.fixture(autouse=True)
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bars are drawn only on a terminal; pytest's captured stdout is not one."""
    monkeypatch.setattr("trainer.callbacks.progress.stdout_is_terminal", lambda: True)


def test_rank_zero_draws_train_and_validation_bars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bar = TQDMProgressBar()
    trainer = FakeTrainer(tmp_path, callbacks=[bar], loggers=[RecordingLogger()], num_training_batches=3)
    trainer.progress_bar_metrics = {"acc": torch.tensor(0.5)}
    trainer.fit(2, val_metrics=lambda epoch: {"val_loss": 1.0},
                train_metrics=lambda step: {"train_loss": 1.0 / step})
    out = capsys.readouterr().out
    assert bar.is_enabled
    assert "Epoch 0" in out and "Epoch 1" in out and "Validation" in out
    assert "3/3" in out and "it/s" in out
    assert "train_loss=0.167" in out and "acc=0.5" in out and "v_num=0" in out
    assert bar.train_progress_bar.disable and bar.eval_progress_bar.disable  # closed at train end (kept to be read)


def test_other_ranks_draw_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bar = TQDMProgressBar()
    trainer = FakeTrainer(tmp_path, global_rank=1, world_size=2, channel=BroadcastChannel(), callbacks=[bar])
    trainer.fit(1, val_metrics=lambda epoch: {"val_loss": 1.0})
    captured = capsys.readouterr()
    assert not bar.is_enabled and captured.out == "" and captured.err == ""


def test_refresh_rate_zero_and_disable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    silent = TQDMProgressBar(refresh_rate=0)
    disabled = TQDMProgressBar()
    disabled.disable()
    for bar in (silent, disabled):
        FakeTrainer(tmp_path, callbacks=[bar]).fit(1, val_metrics=lambda epoch: {"val_loss": 1.0})
        assert bar.is_disabled
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="refresh_rate=-1"):
        TQDMProgressBar(refresh_rate=-1)


def test_print_writes_above_an_active_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bar = TQDMProgressBar()
    bar.print("before", 1)
    trainer = FakeTrainer(tmp_path, callbacks=[bar])
    trainer.call("setup", "fit")
    trainer.call("on_train_epoch_start")
    bar.print("during", 2, sep="-")
    trainer.call("on_train_end")
    out = capsys.readouterr().out
    assert "before 1\n" in out and "during-2\n" in out


def test_leave_keeps_one_bar_per_epoch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bar = TQDMProgressBar(leave=True, refresh_rate=2)
    FakeTrainer(tmp_path, callbacks=[bar], num_training_batches=3, num_val_batches=[]).fit(2)
    out = capsys.readouterr().out
    assert out.count("3/3") >= 2 and "Epoch 1" in out


def test_without_a_terminal_one_line_per_epoch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("trainer.callbacks.progress.stdout_is_terminal", lambda: False)
    bar = TQDMProgressBar()
    trainer = FakeTrainer(tmp_path, callbacks=[bar], loggers=[RecordingLogger()], num_training_batches=3)
    trainer.fit(2, val_metrics=lambda epoch: {"val_loss": 1.0}, train_metrics=lambda step: {"train_loss": 0.5})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("Epoch 0: step 3") and "it/s" in lines[1]
    assert "train_loss=0.5" in lines[1]


def test_total_val_batches_is_zero_in_epochs_without_validation(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.demos.boring_classes import BoringModel

    class RecordsTotals(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.totals: list[float] = []

        def on_train_epoch_end(self) -> None:
            self.totals.append(self.trainer.progress_bar_callback.total_val_batches)

    seen = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        model = RecordsTotals()
        trainer_class(default_root_dir=tmp_path / name, max_epochs=4, num_sanity_val_steps=0, limit_val_batches=2,
                      limit_train_batches=2, check_val_every_n_epoch=2, logger=False).fit(model)
        seen[name] = model.totals
    assert seen["ours"] == seen["lightning"] == [0, 2, 0, 2]


def test_bars_count_outside_a_terminal_and_stay_readable_after_fit(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.demos.boring_classes import BoringModel

    unsized = (torch.randn(4, 32) for _ in iter(int, 1))  # an endless generator: no length
    model = BoringModel()
    model.train_dataloader = lambda: unsized  # type: ignore[method-assign]
    trainer = Trainer(default_root_dir=tmp_path, max_steps=7, max_epochs=-1, limit_val_batches=0,
                      enable_model_summary=False, logger=False)
    bar = trainer.progress_bar_callback
    trainer.fit(model)
    assert bar.train_progress_bar.total == 7 and bar.train_progress_bar.n == 7  # as Lightning's bar reports
    del pl
