"""Lightning's own callbacks (ModelCheckpoint, LearningRateMonitor, the progress bars) read a few
of Lightning's private trainer members; these read-only views answer them from our loop state,
so those callbacks run unchanged in our Trainer. Nothing here is ours to extend: it mirrors
exactly what Lightning 2.6's callbacks read (`trainer.fit_loop.epoch_loop...`,
`trainer._logger_connector.should_update_logs`), and nothing writes through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from trainer.schedule import FitSchedule, effective_max_epochs, logs_at_step, validates_in_epoch
from trainer.state import FitProgress

if TYPE_CHECKING:
    from trainer.prediction_run import PredictionRun


class ViewedTrainer(FitSchedule, Protocol):
    """What the views read of our Trainer: the fit's schedule and progress; `trainer.fit_loop` also lets a
    user set the two loop limits (mypy checks the Trainer against it where trainer.py builds the views)."""

    max_epochs: int | None
    max_steps: int

    @property
    def progress(self) -> FitProgress: ...
    @property
    def log_every_n_steps(self) -> int: ...


class _Counts:
    """Lightning's progress counters, all equal to the batches finished in the epoch."""

    def __init__(self, trainer: ViewedTrainer) -> None:
        self._trainer = trainer

    def __getattr__(self, name: str) -> int:
        if name in ("ready", "started", "processed", "completed"):
            return int(self._trainer.progress.batch_in_epoch)
        raise AttributeError(name)


class _BatchProgress:
    def __init__(self, trainer: ViewedTrainer) -> None:
        self._trainer = trainer
        self.current = _Counts(trainer)

    @property
    def is_last_batch(self) -> bool:
        return bool(self._trainer.fit_run.is_last_batch)


class _ValLoop:
    def __init__(self, trainer: ViewedTrainer) -> None:
        self._trainer = trainer

    @property
    def _has_run(self) -> bool:
        return bool(self._trainer.fit_run.validated_in_fit)


class _EpochLoop:
    def __init__(self, trainer: ViewedTrainer) -> None:
        self._trainer = trainer
        self.batch_progress = _BatchProgress(trainer)
        self.val_loop = _ValLoop(trainer)

    @property
    def _batches_that_stepped(self) -> int:
        return int(self._trainer.progress.stepped_batches)

    @property
    def global_step(self) -> int:
        return int(self._trainer.global_step)

    def _should_check_val_epoch(self) -> bool:
        return validates_in_epoch(self._trainer)


class FitLoopView:
    """`trainer.fit_loop` as far as Lightning's callbacks look into it."""

    def __init__(self, trainer: ViewedTrainer) -> None:
        self._trainer = trainer
        self.epoch_loop = _EpochLoop(trainer)

    @property
    def max_epochs(self) -> int | None:
        return effective_max_epochs(self._trainer)

    @max_epochs.setter
    def max_epochs(self, value: int) -> None:
        """Lightning's way to train on after a fit: `trainer.fit_loop.max_epochs = 10`, then fit again."""
        self._trainer.max_epochs = _limit("max_epochs", value)

    @property
    def min_epochs(self) -> int | None:
        return self._trainer.min_epochs

    @property
    def max_steps(self) -> int:
        return self._trainer.max_steps

    @max_steps.setter
    def max_steps(self, value: int) -> None:
        self._trainer.max_steps = _limit("max_steps", value)

    @property
    def min_steps(self) -> int | None:
        return self._trainer.min_steps

    @property
    def restarting(self) -> bool:
        """True from a mid-epoch checkpoint's restore until that epoch has ended (an epoch-end checkpoint
        starts the next epoch afresh: False)."""
        return self._trainer.fit_run.restarting


class LoggerConnectorView:
    """`trainer._logger_connector.should_update_logs`: will the current batch's values be logged."""

    def __init__(self, trainer: ViewedTrainer) -> None:
        self._trainer = trainer

    @property
    def should_update_logs(self) -> bool:
        trainer = self._trainer
        return logs_at_step(trainer.log_every_n_steps, trainer.progress.stepped_batches, trainer.should_stop)


class PredictLoopView:
    """`trainer.predict_loop` as far as Lightning's `BasePredictionWriter` looks into it."""

    def __init__(self, run: PredictionRun | None) -> None:
        self._run = run

    @property
    def current_batch_indices(self) -> list[int]:
        return self._run.current_batch_indices if self._run is not None else []

    @property
    def epoch_batch_indices(self) -> list[list[list[int]]]:
        return self._run.epoch_batch_indices if self._run is not None else []

    @property
    def predictions(self) -> Any:
        return self._run.results() if self._run is not None else []


def _limit(name: str, value: Any) -> int:
    """A loop limit set on the fit loop: an int, -1 meaning none (Lightning's rule)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError(f"fit_loop.{name}={value!r} must be an int >= -1 (-1: no limit).")
    return value
