"""EarlyStopping: Lightning's callback that stops fitting when a metric stops improving.

Global rank 0 evaluates the metric and broadcasts the outcome (decision and bookkeeping), so
every rank sets `trainer.should_stop` at the same point and no rank is left waiting in a
collective the others have quit.
"""

from __future__ import annotations

import enum
import math
import warnings
from typing import Any, Literal

import torch
from typing_extensions import override

from trainer.callbacks.base import Callback
from trainer.callbacks.save_schedule import run_on_train_epoch_end
from trainer.contract import TrainerContract
from trainer.lightning_types import is_lightning_instance


class EarlyStoppingReason(enum.Enum):
    """Why EarlyStopping stopped the fit (Lightning's names and values)."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4

    def __eq__(self, other: object) -> bool:
        """Also equal to Lightning's member of the same name, so code written against Lightning's
        enum (`callback.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED`) still holds."""
        theirs = "callbacks.early_stopping.EarlyStoppingReason"
        if isinstance(other, enum.Enum) and (type(other) is type(self) or is_lightning_instance(other, theirs)):
            return other.name == self.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)


class EarlyStopping(Callback):
    """Stop when `monitor` has not improved by more than `min_delta` for `patience` checks, crosses
    `stopping_threshold` (good enough) or `divergence_threshold` (hopeless), or is not finite."""

    mode_dict = {"min": torch.lt, "max": torch.gt}
    order_dict = {"min": "<", "max": ">"}

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False,
                 mode: Literal["min", "max"] = "min", strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None) -> None:
        if not isinstance(monitor, str):
            raise TypeError(f"EarlyStopping(monitor={monitor!r}) must be the name of a logged metric (a str).")
        if mode not in self.mode_dict:
            raise ValueError(f"EarlyStopping(mode={mode!r}) is not supported; expected 'min' or 'max'.")
        if patience < 0:
            raise ValueError(f"EarlyStopping(patience={patience}) must be >= 0 (checks without improvement).")
        self.monitor, self.mode, self.patience, self.verbose = monitor, mode, patience, verbose
        self.strict, self.check_finite = strict, check_finite
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        # Stored signed like Lightning, so one comparison `current - min_delta <op> best` serves both modes.
        self.min_delta = abs(min_delta) if mode == "max" else -abs(min_delta)
        self._check_on_train_epoch_end = check_on_train_epoch_end
        self.wait_count = 0
        self.stopped_epoch = 0
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self.best_score = torch.tensor(math.inf if mode == "min" else -math.inf)
        self._fitting = False

    @property
    @override
    def state_key(self) -> str:
        settings = {"monitor": self.monitor, "mode": self.mode}
        return f"{type(self).__qualname__}{settings!r}"

    @property
    def monitor_op(self) -> Any:
        return self.mode_dict[self.mode]

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch,
                "best_score": self.best_score, "patience": self.patience,
                "stopping_reason": self.stopping_reason.value, "stopping_reason_message": self.stopping_reason_message}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"]
        self.best_score = state_dict["best_score"]
        self.patience = state_dict["patience"]
        self.stopping_reason = EarlyStoppingReason(state_dict.get("stopping_reason", 0))
        self.stopping_reason_message = state_dict.get("stopping_reason_message")

    @override
    def setup(self, trainer: TrainerContract, pl_module: Any, stage: str) -> None:
        self._fitting = stage == "fit"

    @override
    def teardown(self, trainer: TrainerContract, pl_module: Any, stage: str) -> None:
        self._fitting = False

    @override
    def on_train_epoch_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        if run_on_train_epoch_end(trainer, self._check_on_train_epoch_end):
            self._run_early_stopping_check(trainer)

    @override
    def on_validation_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        if not run_on_train_epoch_end(trainer, self._check_on_train_epoch_end):
            self._run_early_stopping_check(trainer)

    def _run_early_stopping_check(self, trainer: TrainerContract) -> None:
        if not self._fitting or trainer.sanity_checking or trainer.fast_dev_run:
            return
        outcome = self._decide(trainer.callback_metrics) if trainer.is_global_zero else None
        outcome = trainer.strategy.broadcast(outcome)
        if outcome.get("error"):
            raise RuntimeError(outcome["error"])
        if "state" not in outcome:  # metric missing and strict=False: nothing to decide
            return
        if not trainer.is_global_zero:
            self.load_state_dict(outcome["state"])
        if outcome["stop"]:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason_message = outcome["reason"]
        if self.verbose and outcome["reason"]:
            trainer.print(outcome["reason"])

    def _decide(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Rank 0 only: evaluate the metric, update the bookkeeping, return what all ranks apply."""
        if self.monitor not in metrics:
            message = (f"EarlyStopping(monitor={self.monitor!r}) found no such logged metric; available: "
                       f"{sorted(metrics)}. Log it with self.log({self.monitor!r}, value), change `monitor`, "
                       "or pass strict=False to skip checks while it is missing.")
            if self.strict:
                return {"error": message}
            if self.verbose:
                warnings.warn(message, RuntimeWarning)
            return {}
        current = torch.as_tensor(metrics[self.monitor]).detach().float().cpu().squeeze()
        stop, reason = self._evaluate_stopping_criteria(current)
        return {"stop": stop, "reason": reason, "state": self.state_dict()}

    def _evaluate_stopping_criteria(self, current: torch.Tensor) -> tuple[bool, str | None]:
        """(stop?, the message saying why); sets `stopping_reason` when it stops."""
        return self._stopping_decision(current)

    def _stopping_decision(self, current: torch.Tensor) -> tuple[bool, str | None]:
        name, order = self.monitor, self.order_dict[self.mode]
        if self.check_finite and not torch.isfinite(current):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (f"Monitored metric {name} = {current} is not finite. Previous best value was "
                          f"{float(self.best_score):.3f}. Signaling Trainer to stop.")
        if self.stopping_threshold is not None and self.monitor_op(current, self.stopping_threshold):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (f"Stopping threshold reached: {name} = {current} {order} {self.stopping_threshold}. "
                          "Signaling Trainer to stop.")
        if self.divergence_threshold is not None and self.monitor_op(-current, -self.divergence_threshold):
            beyond = self.order_dict["max" if self.mode == "min" else "min"]
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (f"Divergence threshold reached: {name} = {current} {beyond} "
                          f"{self.divergence_threshold}. Signaling Trainer to stop.")
        if self.monitor_op(current - self.min_delta, self.best_score):
            previous, self.best_score, self.wait_count = self.best_score, current, 0
            gain = f" by {abs(float(previous - current)):.3f}" if torch.isfinite(previous) else ""
            return False, f"Metric {name} improved{gain}. New best score: {float(current):.3f}"
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return True, (f"Monitored metric {name} did not improve in the last {self.wait_count} records. "
                          f"Best score: {float(self.best_score):.3f}. Signaling Trainer to stop.")
        return False, None
