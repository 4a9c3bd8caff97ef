"""TelemetryMonitor: phase times from its own hooks, communication from strategy.summary(),
window averages to the loggers every log_every_n_steps, progress bar, one line at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers.fake_trainer import FakeTrainer, RecordingLogger
from trainer import LightningModule
from trainer.callbacks import telemetry as telemetry_module
from trainer.callbacks.telemetry import TelemetryMonitor


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1e3


def _reducer_summary(steps: int, exposed_ms: float, comm_ms: float) -> dict[str, Any]:
    return {"synced_steps": steps, "exposed_comm_s_total": exposed_ms / 1e3, "comm_s_total": comm_ms / 1e3,
            "buckets": 3, "bucket_sizes_mib": [0.04, 24.0, 8.0], "bucket_cap_mb": 25.0,
            "autotune": {"candidates_mb": [1.0, 25.0], "chosen_mb": 25.0, "done": True, "step_ms": [9.0, 8.0]}}


def _trainer(tmp_path: Path, rank: int = 0, log_every: int = 2) -> tuple[FakeTrainer, RecordingLogger, dict]:
    logger = RecordingLogger()
    trainer = FakeTrainer(tmp_path, global_rank=rank, world_size=2, loggers=[logger])
    trainer.log_every_n_steps = log_every
    comm = {"reducer": _reducer_summary(0, 0.0, 0.0)}
    trainer.strategy.summary = lambda: comm  # type: ignore[method-assign]
    return trainer, logger, comm


def _one_batch(trainer: FakeTrainer, callback: TelemetryMonitor, clock: _Clock, *, step: bool = True) -> None:
    """forward 10 ms, backward 30 ms (incl. exposed comm), 2 ms to the optimizer hook, optimizer 5 ms."""
    callback.on_train_batch_start(trainer, None, None, 0)
    clock.advance(10)
    callback.on_before_backward(trainer, None, torch.tensor(1.0))
    clock.advance(30)
    callback.on_after_backward(trainer, None)
    if step:
        clock.advance(2)
        callback.on_before_optimizer_step(trainer, None, None)
        clock.advance(5)
        trainer.global_step += 1
    callback.on_train_batch_end(trainer, None, None, None, 0)


def test_window_averages_go_to_loggers_and_progress_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(telemetry_module.time, "perf_counter", clock)
    trainer, logger, comm = _trainer(tmp_path)
    callback = TelemetryMonitor()
    callback.on_train_start(trainer, None)
    _one_batch(trainer, callback, clock)
    assert logger.metrics == []  # log_every_n_steps=2
    comm["reducer"] = _reducer_summary(2, exposed_ms=2 * 12.0, comm_ms=2 * 16.0)
    _one_batch(trainer, callback, clock)
    (metrics, step), = logger.metrics
    assert step == 1  # the index of the last optimizer step, as in Lightning
    assert metrics == pytest.approx({
        "telemetry/step_ms": 47.0, "telemetry/forward_ms": 10.0, "telemetry/backward_ms": 18.0,
        "telemetry/exposed_comm_ms": 12.0, "telemetry/comm_ms": 16.0, "telemetry/overlap_pct": 25.0,
        "telemetry/optimizer_ms": 5.0, "telemetry/buckets": 3.0, "telemetry/bucket_cap_mb": 25.0})
    # the bar's text shows them; the metrics dict a program reads holds only what it logged
    assert callback.progress_bar_figures == {"overlap": 25.0, "exposed_ms": 12.0}
    assert trainer.progress_bar_metrics == {}


def test_the_progress_bar_text_shows_the_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.callbacks.progress import TQDMProgressBar

    clock = _Clock()
    monkeypatch.setattr(telemetry_module.time, "perf_counter", clock)
    trainer, _, comm = _trainer(tmp_path, log_every=1)
    callback = TelemetryMonitor(log_to_loggers=False)
    trainer.callbacks.append(callback)
    callback.on_train_start(trainer, None)
    comm["reducer"] = _reducer_summary(1, exposed_ms=4.0, comm_ms=8.0)
    _one_batch(trainer, callback, clock)
    trainer.progress_bar_metrics["train_loss"] = 0.5
    shown = TQDMProgressBar().get_metrics(trainer, None)
    assert shown == {"train_loss": 0.5, "overlap": 50.0, "exposed_ms": 4.0, "v_num": 0}
    assert trainer.progress_bar_metrics == {"train_loss": 0.5}


def test_micro_batches_accumulate_into_one_optimizer_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(telemetry_module.time, "perf_counter", clock)
    trainer, logger, comm = _trainer(tmp_path, log_every=1)
    callback = TelemetryMonitor()
    callback.on_train_start(trainer, None)
    _one_batch(trainer, callback, clock, step=False)  # inside no_sync: nothing reduced, nothing reported
    assert logger.metrics == []
    comm["reducer"] = _reducer_summary(1, exposed_ms=4.0, comm_ms=8.0)
    _one_batch(trainer, callback, clock)
    metrics = logger.metrics[0][0]
    assert metrics["telemetry/forward_ms"] == pytest.approx(20.0)  # two forwards in one optimizer step
    assert metrics["telemetry/backward_ms"] == pytest.approx(56.0)  # 2 x 30 - 4 exposed
    assert metrics["telemetry/overlap_pct"] == pytest.approx(50.0)


def test_summary_line_on_rank_zero_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(telemetry_module.time, "perf_counter", clock)
    for rank in (0, 1):
        trainer, logger, comm = _trainer(tmp_path, rank=rank, log_every=50)
        callback = TelemetryMonitor(print_summary=True)
        callback.on_train_start(trainer, None)
        for _ in range(3):
            _one_batch(trainer, callback, clock)
        comm["reducer"] = _reducer_summary(3, exposed_ms=30.0, comm_ms=60.0)
        callback.on_train_end(trainer, None)
        assert len(logger.metrics) == (1 if rank == 0 else 0)  # the unfinished window is flushed
        if rank == 1:
            assert trainer.printed == []
            continue
        line, = trainer.printed
        assert line.startswith("telemetry: 3 steps, 47.0 ms/step = forward 10.0 + backward 20.0 + exposed comm 10.0")
        assert "overlap 50%" in line and "3 buckets [0.04, 24.00, 8.00] MiB, bucket_cap_mb=auto -> 25.0" in line


def test_without_a_reducer_only_compute_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(telemetry_module.time, "perf_counter", clock)
    trainer, logger, _ = _trainer(tmp_path, log_every=1)
    trainer.strategy.summary = lambda: {"strategy": "SingleDeviceStrategy"}  # type: ignore[method-assign]
    callback = TelemetryMonitor()
    callback.on_train_start(trainer, None)
    _one_batch(trainer, callback, clock)
    assert set(logger.metrics[0][0]) == {"telemetry/step_ms", "telemetry/forward_ms", "telemetry/backward_ms",
                                         "telemetry/optimizer_ms"}
    assert trainer.progress_bar_metrics == {} and callback.progress_bar_figures == {}
    callback.on_train_end(trainer, None)
    assert trainer.printed == []  # the line only when asked
    assert callback.summary_line(trainer).endswith("+ optimizer 5.0 (+ other)")


class Tiny(LightningModule):
    """The smallest module that trains: one linear layer, SGD."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("explicit", [False, True], ids=["trainer-default", "callback-given"])
def test_real_trainer_fit_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str], explicit: bool) -> None:
    """Given as a callback (here asking for the line), telemetry writes logger rows and prints its line;
    the Trainer's default one (enable_telemetry) does neither, so the loggers and the output hold what
    the module logs, as under Lightning."""
    from trainer import Trainer

    class Recorder(RecordingLogger):
        def finalize(self, status: str) -> None:
            pass

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
    logger = Recorder()
    given = [TelemetryMonitor(print_summary=True)] if explicit else []
    trainer = Trainer(max_steps=4, log_every_n_steps=2, callbacks=given, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, accelerator="cpu")
    trainer.loggers.append(logger)  # type: ignore[arg-type]  # a recorder instead of files
    trainer.fit(Tiny(), train_dataloaders=data)
    if explicit:
        assert [step for _, step in logger.metrics] == [1, 3]  # steps 2 and 4 done: logged at their indices
        assert logger.metrics[0][0]["telemetry/step_ms"] > 0
    else:
        assert not any(key.startswith("telemetry/") for row, _ in logger.metrics for key in row)
    assert ("telemetry: 4 steps" in capsys.readouterr().out) is explicit


def test_skipped_none_batches_count_no_step(tmp_path: Path) -> None:
    # A training loader may yield None; the loop skips it (no batch-start hook, no step), so telemetry
    # counts the optimizer steps that ran, not the batches that ended.
    from trainer import Trainer

    def every_other_none(samples: list[Any]) -> Any:
        return None if float(samples[0][0].sum()) < 0 else torch.utils.data.default_collate(samples)

    x = torch.ones(8, 4)
    x[2:4] *= -1  # the second batch of two becomes None
    monitor = TelemetryMonitor()
    trainer = Trainer(max_epochs=1, callbacks=[monitor], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      accelerator="cpu")
    with pytest.warns(UserWarning):
        trainer.fit(Tiny(), train_dataloaders=torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x), batch_size=2, collate_fn=every_other_none))
    assert trainer.global_step == 3 and monitor.fit_metrics(trainer)["steps"] == 3
