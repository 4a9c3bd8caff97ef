"""What `self.log` stores: step values, epoch aggregation, cross-rank sync, the three views.

Lightning's defaults: in `training_step` and the per-batch training hooks a value is logged
per step; everywhere else (validation/test steps, epoch-end hooks) it is aggregated per epoch.
With both `on_step` and `on_epoch`, the logger gets `name_step` and `name_epoch` while
`callback_metrics[name]` holds the latest of the two. Values logged with `sync_dist=True` are
reduced over ranks: every rank must log them (a collective).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

_STEP_HOOKS = {
    "training_step", "on_train_batch_start", "on_train_batch_end", "on_before_backward",
    "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
}
_REDUCE_NAMES: dict[Any, str] = {"mean": "mean", "sum": "sum", "max": "max", "min": "min",
                                 torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min"}
Reducer = Callable[[torch.Tensor, str], torch.Tensor]


def stage_of(fx: str) -> str:
    """The loop stage a hook belongs to; epoch aggregates are kept per stage."""
    for stage, marker in (("validate", "validation"), ("test", "test"), ("predict", "predict")):
        if marker in fx:
            return stage
    return "train"


@dataclass
class _Entry:
    name: str
    stage: str
    on_step: bool
    on_epoch: bool
    prog_bar: bool
    logger: bool
    reduce_fx: str
    sync_dist: bool
    total: torch.Tensor | None = None
    weight: float = 0.0
    metric: Any = None  # a torchmetrics.Metric: computed (and synced) by itself at epoch end
    pending_epoch: bool = field(default=False)

    def keys(self) -> tuple[str, str]:
        """(step key, epoch key) as the logger sees them."""
        if self.on_step and self.on_epoch:
            return f"{self.name}_step", f"{self.name}_epoch"
        return self.name, self.name


class MetricStore:
    """Owned by the Trainer; `LightningModule.log` calls `log`. `reduce` is the strategy's."""

    def __init__(self, reduce: Reducer) -> None:
        self._reduce = reduce
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._step_logs: dict[str, float] = {}
        self.current_batch_size: int | None = None
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.progress_bar_metrics: dict[str, float] = {}
        self.logged_metrics: dict[str, float] = {}

    # ------------------------------------------------------------------ logging
    def log(self, fx: str, name: str, value: Any, prog_bar: bool = False, logger: bool = True,
            on_step: bool | None = None, on_epoch: bool | None = None, reduce_fx: Any = "mean",
            sync_dist: bool = False, batch_size: int | None = None) -> None:
        stage = stage_of(fx)
        step_default = fx in _STEP_HOOKS
        entry = self._entry(fx, name, stage, on_step if on_step is not None else step_default,
                            on_epoch if on_epoch is not None else not step_default,
                            prog_bar, logger, reduce_fx, sync_dist)
        if _is_metric(value):
            self._log_metric_object(entry, value)
            return
        tensor = _as_scalar(name, value)
        if entry.on_step:
            step_value = self._reduce(tensor, entry.reduce_fx) if sync_dist else tensor
            self._publish(entry, entry.keys()[0], step_value, to_logger=True)
        if entry.on_epoch:
            self._accumulate(entry, tensor, batch_size or self.current_batch_size or 1)

    def _entry(self, fx: str, name: str, stage: str, on_step: bool, on_epoch: bool, prog_bar: bool,
               logger: bool, reduce_fx: Any, sync_dist: bool) -> _Entry:
        if reduce_fx not in _REDUCE_NAMES:
            raise ValueError(f"self.log({name!r}, reduce_fx={reduce_fx!r}): expected one of 'mean', 'sum', 'max', "
                             "'min' (or torch.mean/sum/max/min).")
        entry = self._entries.get((stage, name))
        if entry is None:
            entry = _Entry(name, stage, on_step, on_epoch, prog_bar, logger, _REDUCE_NAMES[reduce_fx], sync_dist)
            self._entries[(stage, name)] = entry
        return entry

    def _log_metric_object(self, entry: _Entry, metric: Any) -> None:
        entry.metric = metric
        entry.pending_epoch = entry.on_epoch
        if entry.on_step:
            batch_value = getattr(metric, "_forward_cache", None)
            if batch_value is None:
                batch_value = metric.compute()
            self._publish(entry, entry.keys()[0], _as_scalar(entry.name, batch_value), to_logger=True)

    def _accumulate(self, entry: _Entry, tensor: torch.Tensor, batch_size: int) -> None:
        value = tensor.detach().to(torch.float64)
        if entry.total is None:
            entry.total = value * batch_size if entry.reduce_fx == "mean" else value.clone()
        elif entry.reduce_fx == "mean":
            entry.total = entry.total + value * batch_size
        elif entry.reduce_fx == "sum":
            entry.total = entry.total + value
        else:
            entry.total = torch.maximum(entry.total, value) if entry.reduce_fx == "max" else torch.minimum(entry.total, value)
        entry.weight += batch_size
        entry.pending_epoch = True

    def _publish(self, entry: _Entry, key: str, value: torch.Tensor, to_logger: bool) -> None:
        scalar = value.detach().float().cpu()
        self.callback_metrics[key] = scalar
        self.callback_metrics[entry.name] = scalar
        if entry.prog_bar:
            self.progress_bar_metrics[entry.name] = float(scalar)
        if to_logger and entry.logger:
            self._step_logs[key] = float(scalar)

    # ------------------------------------------------------------------ loop interface
    def reset_stage(self, stage: str) -> None:
        """Forget epoch accumulators of `stage` (called at the start of its epoch)."""
        for key in [k for k in self._entries if k[0] == stage]:
            entry = self._entries.pop(key)
            if entry.metric is not None and hasattr(entry.metric, "reset"):
                entry.metric.reset()

    def compute_epoch(self, stage: str) -> None:
        """Aggregate what `stage` logged since the last call (sync over ranks in a fixed
        order, so every rank issues the same collectives) and publish it."""
        for key in sorted(k for k in self._entries if k[0] == stage):
            entry = self._entries[key]
            if not entry.pending_epoch:
                continue
            entry.pending_epoch = False
            self._publish(entry, entry.keys()[1], self._epoch_value(entry), to_logger=True)

    def _epoch_value(self, entry: _Entry) -> torch.Tensor:
        if entry.metric is not None:
            value = _as_scalar(entry.name, entry.metric.compute())
            entry.metric.reset()
            return value
        assert entry.total is not None  # pending_epoch implies an accumulated value
        total, weight = entry.total, torch.tensor(entry.weight, dtype=torch.float64)
        if entry.sync_dist:
            op = entry.reduce_fx if entry.reduce_fx in ("max", "min") else "sum"
            total = self._reduce(total, op)
            weight = self._reduce(weight, "sum") if entry.reduce_fx == "mean" else weight
        return total / weight if entry.reduce_fx == "mean" else total

    def epoch_keys(self, stage: str) -> list[str]:
        """The epoch-level keys `stage` logged (what `validate()`/`test()` return)."""
        return sorted(entry.keys()[1] for (entry_stage, _), entry in self._entries.items()
                      if entry_stage == stage and entry.on_epoch)

    def pop_logger_metrics(self) -> dict[str, float]:
        """Values due for the logger since the last call; the Trainer writes them on rank 0."""
        metrics, self._step_logs = self._step_logs, {}
        self.logged_metrics.update(metrics)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"callback_metrics": {k: v.clone() for k, v in self.callback_metrics.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.callback_metrics.update(state.get("callback_metrics", {}))


def _is_metric(value: Any) -> bool:
    return hasattr(value, "compute") and hasattr(value, "update") and hasattr(value, "reset")


def _as_scalar(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"self.log({name!r}, ...) needs a scalar; got a tensor of shape {tuple(value.shape)}.")
        return value.detach().reshape(())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value))
    raise TypeError(f"self.log({name!r}, ...) got a {type(value).__name__}; expected a number, a scalar tensor "
                    "or a torchmetrics Metric.")
