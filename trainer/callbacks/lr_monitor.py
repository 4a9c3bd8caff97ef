"""LearningRateMonitor: log every optimizer's learning rate under Lightning's metric names."""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
from typing_extensions import override

from trainer.callbacks.base import Callback
from trainer.contract import TrainerContract
from trainer.schedule import logs_at_step


class LearningRateMonitor(Callback):
    """Log `lr-<Optimizer>` (or the scheduler config's `name`), `-1`, `-2` for repeated optimizer
    classes and `/pgN` (or the group's "name") per param group, to every logger from global rank 0.
    `logging_interval=None` follows each scheduler's own interval."""

    def __init__(self, logging_interval: Literal["step", "epoch"] | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ValueError(f"LearningRateMonitor(logging_interval={logging_interval!r}) is not supported; "
                             "expected 'step', 'epoch' or None (follow each scheduler's interval).")
        self.logging_interval = logging_interval
        self.log_momentum, self.log_weight_decay = log_momentum, log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        # Lightning's public record of the latest values (None until first logged)
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}
        self._last_logged_step = -1

    @override
    def on_train_start(self, trainer: TrainerContract, pl_module: Any) -> None:
        if not trainer.loggers:
            raise ValueError("LearningRateMonitor needs a logger but the Trainer has none (logger=False); "
                             "pass Trainer(logger=True) or a Logger, or remove the callback.")
        if self.log_momentum and not all(_has_momentum(optimizer) for optimizer in trainer.optimizers):
            warnings.warn("LearningRateMonitor(log_momentum=True): some optimizers do not have momentum; their "
                          "momentum is logged as 0.", RuntimeWarning, stacklevel=2)
        for _, keys, _ in _named_optimizers(trainer):
            duplicated = sorted({key for key in keys if keys.count(key) > 1})
            if duplicated:
                raise ValueError(f"LearningRateMonitor: several param groups of one optimizer are named "
                                 f"{duplicated[0].split('/')[-1]!r}, so their learning rates would be logged under one "
                                 "key; give each param group a unique 'name'.")
            for key in keys:  # Lightning lists every series from the start, in this order
                self.lrs.setdefault(key, [])

    @override
    def on_train_batch_start(self, trainer: TrainerContract, pl_module: Any, batch: Any, batch_idx: int) -> None:
        step = _batches_stepped(trainer)  # one per batch however many optimizers stepped (Lightning's count)
        due = logs_at_step(trainer.log_every_n_steps, step, trainer.should_stop)
        if self.logging_interval != "epoch" and due and step != self._last_logged_step:
            self._last_logged_step = step
            self._log(trainer, "step" if self.logging_interval is None else "any")

    @override
    def on_train_epoch_start(self, trainer: TrainerContract, pl_module: Any) -> None:
        if self.logging_interval != "step":
            self._log(trainer, "epoch" if self.logging_interval is None else "any")

    def _log(self, trainer: TrainerContract, interval: str) -> None:
        stats: dict[str, float] = {}
        named = _named_optimizers(trainer)
        self._continue_series_of_split_optimizers([key for _, keys, _ in named for key in keys])
        for optimizer, keys, own_interval in named:
            if own_interval is None or interval in ("any", own_interval):
                stats.update(self._stats(optimizer, keys))
        if not stats:
            return
        trainer.callback_metrics.update({key: torch.tensor(value) for key, value in stats.items()})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics=stats, step=_batches_stepped(trainer))

    def _continue_series_of_split_optimizers(self, keys: list[str]) -> None:
        """An optimizer that gains a param group mid-fit (fine-tuning unfreezes a layer) changes its
        key from `lr-SGD` to `lr-SGD/pg1` and `lr-SGD/pg2`: the history so far continues as `/pg1`."""
        for key in keys:
            single = key[:-len("/pg1")] if key.endswith("/pg1") else None
            if single is not None and single in self.lrs and key not in self.lrs:
                self.lrs[key] = self.lrs.pop(single)

    def _stats(self, optimizer: Any, keys: list[str]) -> dict[str, float]:
        stats: dict[str, float] = {}
        for group, key in zip(optimizer.param_groups, keys):
            stats[key] = float(group["lr"])
            self.lrs.setdefault(key, []).append(stats[key])
            if self.log_momentum:
                momentum = group["betas"][0] if "betas" in group else group.get("momentum", 0.0)
                stats[f"{key}-momentum"] = self.last_momentum_values[f"{key}-momentum"] = float(momentum)
            if self.log_weight_decay:
                decay = float(group.get("weight_decay", 0.0))
                stats[f"{key}-weight_decay"] = self.last_weight_decay_values[f"{key}-weight_decay"] = decay
        return stats


def _batches_stepped(trainer: TrainerContract) -> int:
    """Batches that ended with an optimizer step before this one (what Lightning logs learning rates
    at); a trainer without that count (one step per batch) answers with global_step."""
    progress = getattr(trainer, "progress", None)
    return int(getattr(progress, "stepped_batches", trainer.global_step))


def _has_momentum(optimizer: Any) -> bool:
    return all("betas" in group or "momentum" in group for group in optimizer.param_groups)


def _named_optimizers(trainer: TrainerContract) -> list[tuple[Any, list[str], str | None]]:
    """(optimizer, one key per param group, scheduler interval or None when it has no scheduler)."""
    entries: list[tuple[Any, list[str], str | None]] = []
    counts: dict[type, int] = {}
    for config in trainer.lr_scheduler_configs:
        optimizer = config.scheduler.optimizer
        name = config.name or f"lr-{type(optimizer).__name__}"
        entries.append((optimizer, _keys(optimizer, name, counts, config.name is None), config.interval))
    for optimizer in trainer.optimizers:
        optimizer = getattr(optimizer, "optimizer", optimizer)  # unwrap a LightningOptimizer-style proxy
        if not any(optimizer is seen for seen, _, _ in entries):
            entries.append((optimizer, _keys(optimizer, f"lr-{type(optimizer).__name__}", counts, True), None))
    return entries


def _keys(optimizer: Any, name: str, counts: dict[type, int], count: bool) -> list[str]:
    if count:
        counts[type(optimizer)] = counts.get(type(optimizer), 0) + 1
    if counts.get(type(optimizer), 0) > 1:
        name = f"{name}-{counts[type(optimizer)] - 1}"
    groups = optimizer.param_groups
    if len(groups) == 1:
        return [f"{name}/{groups[0]['name']}" if groups[0].get("name") else name]
    return [f"{name}/{group.get('name', f'pg{index + 1}')}" for index, group in enumerate(groups)]
