"""When the fit validates and when it stops: Lightning's rules, read from the Trainer's arguments
and progress (nothing here runs a hook or requests a loader)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from strategies.rank_zero import rank_zero_info, rank_zero_warn
from trainer.data_sources import INFINITE, unlimited_if_negative

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def validates_in_epoch(trainer: Trainer) -> bool:
    """Whether validation runs in the current training epoch (check_val_every_n_epoch)."""
    every_n_epochs = trainer.check_val_every_n_epoch
    due = every_n_epochs is None or (trainer.current_epoch + 1) % every_n_epochs == 0
    return bool(trainer.enable_validation) and due


def validation_due(trainer: Trainer, batch_idx: int, epoch_ended: bool) -> bool:
    """Whether `val_check_interval` (or a stop request) calls for a validation after this batch."""
    if trainer.should_stop and can_stop_early(trainer):
        return True
    total, interval, every = trainer.num_training_batches, trainer.val_check_interval, validation_every(trainer)
    if every == INFINITE:
        return epoch_ended
    if total == INFINITE:
        return (batch_idx + 1) % every == 0
    counter = batch_idx if trainer.check_val_every_n_epoch is not None else trainer.current_epoch * total + batch_idx
    return (counter + 1) % every == 0 or (batch_idx + 1 == total and isinstance(interval, float) and interval == 1.0)


def validation_every(trainer: Trainer) -> int | float:
    """Training batches between validations (Lightning's `trainer.val_check_batch`): an int interval as it
    is, a fraction of the epoch's batches (at least 1), or inf for a fraction of a loader without a length
    (validation then runs when its epoch ends)."""
    interval, total = trainer.val_check_interval, trainer.num_training_batches
    if isinstance(interval, int):
        return interval
    if total == INFINITE:
        return INFINITE
    return max(1, int(total * interval))


def check_val_interval(trainer: Trainer) -> None:
    """An int interval longer than the epoch would silently never validate (Lightning raises too)."""
    interval, total = trainer.val_check_interval, trainer.num_training_batches
    if total == INFINITE and isinstance(interval, float) and interval != 1.0:
        raise ValueError(f"val_check_interval={interval} is a fraction of an epoch, but the training data has no "
                         "length (an IterableDataset): use 1.0 (validate when the epoch ends) or an int number of "
                         "batches.")
    if isinstance(interval, int) and trainer.check_val_every_n_epoch is not None and total < interval \
            and trainer.limit_val_batches != 0:
        raise ValueError(f"val_check_interval={interval} batches exceeds the {total} training batches per epoch; "
                         "use a smaller int, a float fraction of the epoch, or check_val_every_n_epoch=None.")


def can_stop_early(trainer: Trainer) -> bool:
    """`should_stop` is honoured only once min_epochs and min_steps are met (Lightning's rule)."""
    met_epochs = trainer.current_epoch >= (trainer.min_epochs or 0)
    met_steps = trainer.global_step >= (trainer.min_steps or 0)
    return met_epochs and met_steps


def fit_done(trainer: Trainer) -> bool:
    """The fit has reached max_steps or max_epochs, or a stop request it may honour."""
    if max_steps_reached(trainer):
        return True
    max_epochs = effective_max_epochs(trainer)
    if max_epochs >= 0 and trainer.current_epoch >= max_epochs:
        return True
    if trainer.should_stop:
        if can_stop_early(trainer):
            return True
        rank_zero_info(f"Trainer was signaled to stop but the required min_epochs={trainer.min_epochs} or "
                       f"min_steps={trainer.min_steps} has not been met; training continues until it is.")
    return False


def max_steps_reached(trainer: Trainer) -> bool:
    return trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps


def effective_max_epochs(trainer: Trainer) -> int:
    """Lightning's rule for `max_epochs=None`, its one home: no epoch limit when `max_steps` or
    `max_time` bounds the fit, otherwise 1000 epochs (`trainer.max_epochs` takes that value when fit
    starts: `settled_max_epochs`)."""
    if trainer.max_epochs is not None:
        return int(trainer.max_epochs)
    return -1 if trainer.max_steps != -1 or trainer.max_time is not None else 1000


def settled_max_epochs(trainer: Trainer) -> int:
    """The value `max_epochs=None` takes when fit starts (as in Lightning); falling back to 1000
    epochs, with nothing else bounding the fit, is worth a warning."""
    max_epochs = effective_max_epochs(trainer)
    if trainer.max_epochs is None and max_epochs == 1000:
        rank_zero_warn("Trainer(max_epochs=None) with neither max_steps nor max_time: the fit stops after 1000 "
                       "epochs. Pass max_epochs=-1 to train without an epoch limit, or set the limit you want.")
    return max_epochs


def stepping_batches(trainer: Trainer, per_epoch: int | float) -> int | float:
    """Optimizer steps a fit of `per_epoch` training batches an epoch takes (Lightning's
    `estimated_stepping_batches`): every epoch's steps, bounded by max_steps."""
    steps_limit = unlimited_if_negative(trainer.max_steps)
    max_epochs = effective_max_epochs(trainer)
    if per_epoch == INFINITE or max_epochs == -1:
        return steps_limit
    steps_per_epoch = max(1, math.ceil(per_epoch / trainer.accumulate_grad_batches)) if per_epoch else 0
    return min(steps_per_epoch * max_epochs, steps_limit)


def time_is_up(trainer: Trainer) -> bool:
    """max_time: the fit stops at the first batch boundary past the deadline (Lightning's Timer)."""
    limit = trainer.max_time
    return limit is not None and time.monotonic() - trainer.fit_run.started_at >= limit.total_seconds()
