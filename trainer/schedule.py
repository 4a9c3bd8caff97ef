"""When the fit validates and when it stops: Lightning's rules, read from the schedule's settings and the
fit's progress (nothing here runs a hook or requests a loader).

The rules read a `FitSchedule`, which the fit loop's `Stage` and the `Trainer` (its facade properties,
Lightning's views) both are, so one function serves both; mypy checks each at its call sites. Settings a
callback or the tuner may change mid-fit (max_epochs, val_check_interval, should_stop, ...) are read at
each call, never kept.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Protocol

from strategies.rank_zero import rank_zero_info, rank_zero_warn
from trainer.data_sources import INFINITE, unlimited_if_negative
from trainer.state import FitRun


class ScheduleSettings(Protocol):
    """The Trainer's settings the schedule reads. A callback or the tuner may change any of them mid-fit
    (`trainer.fit_loop.max_epochs = n`, GradientAccumulationScheduler), so they are read at each call."""

    @property
    def max_epochs(self) -> int | None: ...
    @property
    def min_epochs(self) -> int | None: ...
    @property
    def max_steps(self) -> int: ...
    @property
    def min_steps(self) -> int | None: ...
    @property
    def max_time(self) -> timedelta | None: ...
    @property
    def val_check_interval(self) -> int | float: ...
    @property
    def check_val_every_n_epoch(self) -> int | None: ...
    @property
    def limit_val_batches(self) -> int | float: ...
    @property
    def accumulate_grad_batches(self) -> int: ...  # GradientAccumulationScheduler sets it as each epoch starts


class EpochValidation(Protocol):
    """What `validates_in_epoch` reads: part of the Trainer's contract, so the progress bar may ask too."""

    @property
    def check_val_every_n_epoch(self) -> int | None: ...
    @property
    def current_epoch(self) -> int: ...
    @property
    def enable_validation(self) -> bool: ...


class FitSchedule(ScheduleSettings, EpochValidation, Protocol):
    """The settings and progress the fit's schedule reads (a Stage, or the Trainer)."""

    @property
    def global_step(self) -> int: ...
    @property
    def should_stop(self) -> bool: ...
    @property
    def num_training_batches(self) -> int | float: ...
    @property
    def fit_run(self) -> FitRun: ...


def validates_in_epoch(schedule: EpochValidation) -> bool:
    """Whether validation runs in the current training epoch (check_val_every_n_epoch)."""
    every_n_epochs = schedule.check_val_every_n_epoch
    due = every_n_epochs is None or (schedule.current_epoch + 1) % every_n_epochs == 0
    return bool(schedule.enable_validation) and due


def validation_due(schedule: FitSchedule, batch_idx: int, epoch_ended: bool) -> bool:
    """Whether `val_check_interval` (or a stop request) calls for a validation after this batch."""
    if schedule.should_stop and can_stop_early(schedule):
        return True
    total, interval, every = schedule.num_training_batches, schedule.val_check_interval, validation_every(schedule)
    if every == INFINITE:
        return epoch_ended
    if total == INFINITE:
        return (batch_idx + 1) % every == 0
    counter = batch_idx if schedule.check_val_every_n_epoch is not None else schedule.current_epoch * total + batch_idx
    return (counter + 1) % every == 0 or (batch_idx + 1 == total and isinstance(interval, float) and interval == 1.0)


def validation_every(schedule: FitSchedule) -> int | float:
    """Training batches between validations (Lightning's `trainer.val_check_batch`): an int interval as it
    is, a fraction of the epoch's batches (at least 1), or inf for a fraction of a loader without a length
    (validation then runs when its epoch ends)."""
    interval, total = schedule.val_check_interval, schedule.num_training_batches
    if isinstance(interval, int):
        return interval
    if total == INFINITE:
        return INFINITE
    return max(1, int(total * interval))


def check_val_interval(schedule: FitSchedule) -> None:
    """An int interval longer than the epoch would silently never validate (Lightning raises too)."""
    interval, total = schedule.val_check_interval, schedule.num_training_batches
    if total == INFINITE and isinstance(interval, float) and interval != 1.0:
        raise ValueError(f"val_check_interval={interval} is a fraction of an epoch, but the training data has no "
                         "length (an IterableDataset): use 1.0 (validate when the epoch ends) or an int number of "
                         "batches.")
    if isinstance(interval, int) and schedule.check_val_every_n_epoch is not None and total < interval \
            and schedule.limit_val_batches != 0:
        raise ValueError(f"val_check_interval={interval} batches exceeds the {total} training batches per epoch; "
                         "use a smaller int, a float fraction of the epoch, or check_val_every_n_epoch=None.")


def logs_at_step(every: int, stepped_batches: int, should_stop: bool) -> bool:
    """Whether the current batch's step metrics reach the loggers (Lightning's `should_update_logs`): every
    `log_every_n_steps` (`every`) batches that stepped, counting this one, and on a stop request."""
    return bool(every) and ((stepped_batches + 1) % every == 0 or should_stop)


def can_stop_early(schedule: FitSchedule) -> bool:
    """`should_stop` is honoured only once min_epochs and min_steps are met (Lightning's rule)."""
    met_epochs = schedule.current_epoch >= (schedule.min_epochs or 0)
    met_steps = schedule.global_step >= (schedule.min_steps or 0)
    return met_epochs and met_steps


def fit_done(schedule: FitSchedule) -> bool:
    """The fit has reached max_steps or max_epochs, or a stop request it may honour."""
    if max_steps_reached(schedule):
        return True
    max_epochs = effective_max_epochs(schedule)
    if max_epochs >= 0 and schedule.current_epoch >= max_epochs:
        return True
    if schedule.should_stop:
        if can_stop_early(schedule):
            return True
        rank_zero_info(f"Trainer was signaled to stop but the required min_epochs={schedule.min_epochs} or "
                       f"min_steps={schedule.min_steps} has not been met; training continues until it is.")
    return False


def max_steps_reached(schedule: FitSchedule) -> bool:
    return schedule.max_steps >= 0 and schedule.global_step >= schedule.max_steps


def effective_max_epochs(schedule: FitSchedule) -> int:
    """Lightning's rule for `max_epochs=None`, its one home: no epoch limit when `max_steps` or
    `max_time` bounds the fit, otherwise 1000 epochs (`trainer.max_epochs` takes that value when fit
    starts: `settled_max_epochs`)."""
    if schedule.max_epochs is not None:
        return int(schedule.max_epochs)
    return -1 if schedule.max_steps != -1 or schedule.max_time is not None else 1000


def settled_max_epochs(schedule: FitSchedule) -> int:
    """The value `max_epochs=None` takes when fit starts (as in Lightning); falling back to 1000
    epochs, with nothing else bounding the fit, is worth a warning."""
    max_epochs = effective_max_epochs(schedule)
    if schedule.max_epochs is None and max_epochs == 1000:
        rank_zero_warn("Trainer(max_epochs=None) with neither max_steps nor max_time: the fit stops after 1000 "
                       "epochs. Pass max_epochs=-1 to train without an epoch limit, or set the limit you want.")
    return max_epochs


def stepping_batches(schedule: FitSchedule, per_epoch: int | float) -> int | float:
    """Optimizer steps a fit of `per_epoch` training batches an epoch takes (Lightning's
    `estimated_stepping_batches`): every epoch's steps, bounded by max_steps."""
    steps_limit = unlimited_if_negative(schedule.max_steps)
    max_epochs = effective_max_epochs(schedule)
    if per_epoch == INFINITE or max_epochs == -1:
        return steps_limit
    steps_per_epoch = max(1, math.ceil(per_epoch / schedule.accumulate_grad_batches)) if per_epoch else 0
    return min(steps_per_epoch * max_epochs, steps_limit)


def time_is_up(schedule: FitSchedule) -> bool:
    """max_time: the fit stops at the first batch boundary past the deadline (Lightning's Timer)."""
    limit = schedule.max_time
    return limit is not None and time.monotonic() - schedule.fit_run.started_at >= limit.total_seconds()
