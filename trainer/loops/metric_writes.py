"""Sending the metric store's due values to the loggers: on global rank 0 only, never during the
sanity check (Lightning logs nothing there), at the step Lightning logs them at."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def write_logger_metrics(trainer: Trainer, step: int | None = None) -> None:
    """What the metric store has due, with the epoch, at `step` (default: `trainer.logger_step`)."""
    store = trainer.metric_store
    if not (trainer.loggers and trainer.is_global_zero and not trainer.sanity_checking):
        store.drop_logger_metrics()
        return
    metrics = store.pop_logger_metrics()
    if metrics:
        metrics = {**metrics, "epoch": trainer.current_epoch}
        for logger in trainer.loggers:
            logger.log_metrics(metrics=metrics, step=trainer.logger_step if step is None else step)


def write_eval_step_metrics(trainer: Trainer, step: int) -> None:
    """An evaluation batch's step values, one logger row per batch at `step` (the batches that
    dataloader has run), without "epoch", as in Lightning."""
    metrics = trainer.metric_store.pop_eval_step_metrics()
    if metrics and trainer.is_global_zero and not trainer.sanity_checking:
        for logger in trainer.loggers:
            logger.log_metrics(metrics=metrics, step=step)
