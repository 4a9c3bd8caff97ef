from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers.fake_trainer import BroadcastChannel, FakeTrainer, RecordingLogger, scheduler_config
from trainer.callbacks import LearningRateMonitor


def _params(n: int = 1) -> list[nn.Parameter]:
    return [nn.Parameter(torch.zeros(1)) for _ in range(n)]


def _trainer(tmp_path: Path, callback: LearningRateMonitor) -> tuple[FakeTrainer, RecordingLogger]:
    logger = RecordingLogger()
    trainer = FakeTrainer(tmp_path, callbacks=[callback], loggers=[logger], num_training_batches=2)
    return trainer, logger


def test_epoch_scheduler_is_logged_at_epoch_start_with_its_values(tmp_path: Path) -> None:
    trainer, logger = _trainer(tmp_path, LearningRateMonitor())
    optimizer = torch.optim.SGD(_params(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    trainer.optimizers, trainer.lr_scheduler_configs = [optimizer], [scheduler_config(scheduler)]
    trainer.call("on_train_start")
    for epoch in range(3):
        trainer.current_epoch, trainer.global_step = epoch, epoch * 2
        trainer.call("on_train_epoch_start")
        trainer.call("on_train_batch_start", None, 0)  # an epoch-interval scheduler is not logged per step
        optimizer.step()
        scheduler.step()
    assert logger.metrics == [({"lr-SGD": 1.0}, 0), ({"lr-SGD": 0.5}, 2), ({"lr-SGD": 0.25}, 4)]
    assert trainer.callback_metrics["lr-SGD"].item() == 0.25


def test_step_interval_param_groups_momentum_and_weight_decay(tmp_path: Path) -> None:
    callback = LearningRateMonitor(logging_interval="step", log_momentum=True, log_weight_decay=True)
    trainer, logger = _trainer(tmp_path, callback)
    optimizer = torch.optim.Adam([{"params": _params()}, {"params": _params(), "lr": 0.01}], lr=0.1,
                                 betas=(0.8, 0.99), weight_decay=0.5)
    trainer.optimizers = [optimizer]
    trainer.fit(1)
    assert [step for _, step in logger.metrics] == [0, 1]
    assert logger.metrics[0][0] == pytest.approx({
        "lr-Adam/pg1": 0.1, "lr-Adam/pg1-momentum": 0.8, "lr-Adam/pg1-weight_decay": 0.5,
        "lr-Adam/pg2": 0.01, "lr-Adam/pg2-momentum": 0.8, "lr-Adam/pg2-weight_decay": 0.5})
    assert callback.lrs["lr-Adam/pg2"] == pytest.approx([0.01, 0.01])


def test_names_from_config_repeated_classes_and_group_names(tmp_path: Path) -> None:
    trainer, logger = _trainer(tmp_path, LearningRateMonitor(logging_interval="epoch"))
    first, second = torch.optim.SGD(_params(), lr=0.1), torch.optim.SGD(_params(), lr=0.2)
    named = torch.optim.SGD([{"params": _params(), "name": "head"}], lr=0.3)
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.Adam(_params(), lr=0.4), step_size=1)
    trainer.optimizers = [first, second, named, scheduler.optimizer]
    trainer.lr_scheduler_configs = [scheduler_config(scheduler, interval="step", name="my-lr")]
    trainer.fit(1)
    assert logger.metrics == [({"my-lr": 0.4, "lr-SGD": 0.1, "lr-SGD-1": 0.2, "lr-SGD-2/head": 0.3}, 0)]


def test_log_every_n_steps_is_respected(tmp_path: Path) -> None:
    trainer, logger = _trainer(tmp_path, LearningRateMonitor(logging_interval="step"))
    trainer.optimizers, trainer.log_every_n_steps = [torch.optim.SGD(_params(), lr=0.1)], 2
    trainer.fit(2)  # steps before each batch: 0, 1, 2, 3 -> (step + 1) % 2 == 0 at 1 and 3
    assert [step for _, step in logger.metrics] == [1, 3]


def test_no_logger_is_an_error(tmp_path: Path) -> None:
    trainer = FakeTrainer(tmp_path, callbacks=[LearningRateMonitor()])
    with pytest.raises(ValueError, match="LearningRateMonitor needs a logger"):
        trainer.fit(1)


def test_only_global_rank_zero_logs(tmp_path: Path) -> None:
    logger = RecordingLogger()
    trainer = FakeTrainer(tmp_path, global_rank=1, world_size=2, channel=BroadcastChannel(),
                          callbacks=[LearningRateMonitor()], loggers=[logger])
    trainer.optimizers = [torch.optim.SGD(_params(), lr=0.1)]
    trainer.fit(1)
    assert logger.metrics == [] and list(tmp_path.iterdir()) == []


def test_bad_logging_interval() -> None:
    with pytest.raises(ValueError, match="logging_interval='batch'"):
        LearningRateMonitor(logging_interval="batch")  # type: ignore[arg-type]
