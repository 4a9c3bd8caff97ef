"""When ModelCheckpoint saves: every n training steps, every n epochs, or every time interval,
and whether epoch-level work runs at the training epoch's end or after validation.

The triggers are mutually exclusive, as in Lightning; with none given, ModelCheckpoint saves once
per epoch. Time is measured on global rank 0 and broadcast, so every rank saves at the same step.
"""

from __future__ import annotations

import time
from datetime import timedelta

from trainer.contract import TrainerContract


def run_on_train_epoch_end(trainer: TrainerContract, explicit: bool | None) -> bool:
    """Lightning's rule for epoch-level work (saving, early-stopping checks): at train epoch end
    when there is no validation or it runs exactly once at each epoch's end (then both train and
    validation epoch metrics exist), otherwise right after each validation."""
    if explicit is not None:
        return explicit
    if trainer.check_val_every_n_epoch != 1:
        return False
    if sum(trainer.num_val_batches or [0]) == 0:
        return True
    return trainer.val_check_interval == 1.0


class SaveSchedule:
    """ModelCheckpoint's triggers: `every_n_train_steps`, `every_n_epochs` (0 disables one),
    `train_time_interval` and `save_on_train_epoch_end`, validated here where they are read."""

    def __init__(self, every_n_train_steps: int | None, every_n_epochs: int | None,
                 train_time_interval: timedelta | None, save_on_train_epoch_end: bool | None) -> None:
        _validate(every_n_train_steps, every_n_epochs, train_time_interval)
        no_trigger = every_n_train_steps is None and every_n_epochs is None and train_time_interval is None
        self.every_n_train_steps = every_n_train_steps or 0
        self.every_n_epochs = 1 if no_trigger else (every_n_epochs or 0)  # Lightning's default: once an epoch
        self.train_time_interval = train_time_interval
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self._last_time_saved = time.monotonic()

    def __eq__(self, other: object) -> bool:
        """Equal settings and clock: a pickled and restored ModelCheckpoint equals the original (`vars(a) == vars(b)`)."""
        return type(other) is type(self) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable (the clock), compared by value

    def steps_due(self, trainer: TrainerContract) -> bool:
        return self.every_n_train_steps >= 1 and trainer.global_step % self.every_n_train_steps == 0

    def time_due(self, trainer: TrainerContract) -> bool:
        """Rank 0's clock decides (one broadcast a batch, on every rank alike)."""
        if self.train_time_interval is None:
            return False
        elapsed = time.monotonic() - self._last_time_saved
        return bool(trainer.strategy.broadcast(elapsed >= self.train_time_interval.total_seconds()))

    def restart_clock(self) -> None:
        self._last_time_saved = time.monotonic()

    def epoch_due(self, trainer: TrainerContract) -> bool:
        return self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def at_train_epoch_end(self, trainer: TrainerContract) -> bool:
        """Epoch-level saves run at the training epoch's end (True) or after validation (False)."""
        return run_on_train_epoch_end(trainer, self.save_on_train_epoch_end)


def _validate(every_n_train_steps: int | None, every_n_epochs: int | None,
              train_time_interval: timedelta | None) -> None:
    for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
        if value is not None and value < 0:
            raise ValueError(f"ModelCheckpoint({name}={value}) must be >= 0 (0 disables this trigger).")
    if (every_n_train_steps or 0) > 0 and (every_n_epochs or 0) > 0:
        raise ValueError(f"ModelCheckpoint(every_n_train_steps={every_n_train_steps}, every_n_epochs="
                         f"{every_n_epochs}): the triggers are mutually exclusive; set only one of them.")
    if train_time_interval is not None and (every_n_train_steps or every_n_epochs):
        raise ValueError("ModelCheckpoint: pass one of every_n_train_steps, every_n_epochs and "
                         "train_time_interval, not several.")
    if train_time_interval is not None and not isinstance(train_time_interval, timedelta):
        raise TypeError(f"ModelCheckpoint(train_time_interval={train_time_interval!r}) must be a "
                        "datetime.timedelta.")
