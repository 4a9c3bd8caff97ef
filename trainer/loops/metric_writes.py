"""Sending the metric store's due values to the loggers: on global rank 0 only, never during the
sanity check (Lightning logs nothing there), at the step Lightning logs them at."""

from __future__ import annotations

from trainer.stage import Stage


def write_logger_metrics(stage: Stage, step: int | None = None) -> None:
    """What the metric store has due, with the epoch, at `step` (default: `trainer.logger_step`, the
    batches that stepped before the current one)."""
    store = stage.metrics
    if not (stage.loggers and _logs_now(stage)):
        store.drop_logger_metrics()
        return
    metrics = store.pop_logger_metrics()
    if metrics:
        metrics = {**metrics, "epoch": stage.progress.current_epoch}
        for logger in stage.loggers:
            logger.log_metrics(metrics=metrics, step=stage.progress.stepped_batches if step is None else step)


def write_eval_step_metrics(stage: Stage, step: int) -> None:
    """An evaluation batch's step values, one logger row per batch at `step` (the batches that
    dataloader has run), without "epoch", as in Lightning."""
    metrics = stage.metrics.pop_eval_step_metrics()
    if metrics and _logs_now(stage):
        for logger in stage.loggers:
            logger.log_metrics(metrics=metrics, step=step)


def _logs_now(stage: Stage) -> bool:
    """Global rank 0 logs, and not during the sanity check."""
    return stage.strategy.is_global_zero and stage.status.stage != "sanity_check"
