"""What `self.log` stores: step values, epoch aggregation, cross-rank sync, the three views.

Which hooks may log, and whether a value is logged per step or aggregated per epoch there unless
told, is Lightning's rule (trainer/log_rules.py). With both `on_step` and `on_epoch`, the logger
gets `name_step` and `name_epoch` while `callback_metrics[name]` holds the latest of the two.

`sync_dist=True` values are reduced over ranks, so every rank must log the same sync_dist keys.
They are batched: everything due at one sync point travels in ONE all-reduce (a stacked float64
vector), never one collective per key. The sync points are fixed places in the loop that every
rank reaches alike: `sync_pending()` after a training step's hooks, and `compute_epoch()`
at epoch end. Epoch values are exact global aggregates (sums of value x batch size and of batch
sizes, not a mean of per-rank means), so at world size N they equal one process on the same data.

Evaluation shards may be uneven (one batch more on some ranks), so evaluation issues no
collective per batch: a step-level `sync_dist` value logged during validation/test is published
as this rank's own value (with a one-time warning) and only the epoch value is synced.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from strategies.rank_zero import rank_zero_warn
from trainer.log_rules import LoggingError, logging_levels

_REDUCE_NAMES: dict[Any, str] = {"mean": "mean", "sum": "sum", "max": "max", "min": "min",
                                 torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min",
                                 max: "max", min: "min", sum: "sum"}
Reducer = Callable[..., torch.Tensor]  # a strategy's reduce(tensor, reduce_op=...)
_Request = tuple[str, torch.Tensor]  # (op: "sum" | "max" | "min", float64 scalar)


class RankInfo(Protocol):
    """What the store needs to pack max/min values into the same all-reduce as the sums (a
    Strategy satisfies it)."""

    @property
    def global_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...


def stage_of(fx: str) -> str:
    """The loop stage a hook belongs to; epoch aggregates are kept per stage."""
    for stage, marker in (("validate", "validation"), ("test", "test"), ("predict", "predict")):
        if marker in fx:
            return stage
    return "train"


@dataclass
class _Entry:
    fx: str  # the hook that first logged it
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
    suffix: str = ""  # "/dataloader_idx_N" when logged from one of several evaluation dataloaders
    # the evaluation dataloaders it was logged from (add_dataloader_idx=False keeps one name for all)
    logged_from: set[int] = field(default_factory=set)

    @property
    def full_name(self) -> str:
        return self.name + self.suffix

    def keys(self) -> tuple[str, str]:
        """(step key, epoch key) as the logger sees them (Lightning: `name_step/dataloader_idx_0`)."""
        if self.on_step and self.on_epoch:
            return f"{self.name}_step{self.suffix}", f"{self.name}_epoch{self.suffix}"
        return self.full_name, self.full_name


class MetricStore:
    """Owned by the Trainer; `LightningModule.log` calls `log`. `reduce` is the strategy's.

    `ranks` (the strategy) lets max/min values share the single all-reduce with the sums; without
    it they take a second one.
    """

    def __init__(self, reduce: Reducer, ranks: RankInfo | None = None) -> None:
        self._reduce = reduce
        self._ranks = ranks
        self._entries: dict[tuple[str, str], _Entry] = {}
        # Values stay tensors (on the device) until someone reads them: turning one into a float
        # waits for the device, and a step that logs must not (values are read at log_every_n_steps,
        # when the progress bar refreshes, or when a user reads the dicts).
        self._step_logs: dict[str, torch.Tensor] = {}
        self._eval_step_logs: dict[str, torch.Tensor] = {}
        self._unread_bar: dict[str, torch.Tensor] = {}
        self._pending_steps: dict[str, tuple[_Entry, torch.Tensor]] = {}
        self._warned: set[tuple[str, str]] = set()
        self.current_batch_size: int | None = None
        self.dataloader_idx: int | None = None  # set by the evaluation loop when it has several loaders
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self._progress_bar_metrics: dict[str, float] = {}
        self.logged_metrics: dict[str, torch.Tensor] = {}  # scalar tensors, as Lightning's (loggers get floats)

    # ------------------------------------------------------------------ logging
    def log(self, fx: str, name: str, value: Any, prog_bar: bool = False, logger: bool = True,
            on_step: bool | None = None, on_epoch: bool | None = None, reduce_fx: Any = "mean",
            sync_dist: bool = False, batch_size: int | None = None, add_dataloader_idx: bool = True) -> None:
        on_step, on_epoch = logging_levels(fx, name, on_step, on_epoch)
        if add_dataloader_idx and "/dataloader_idx_" in name:
            raise LoggingError(f"self.log({name!r}): the Trainer adds '/dataloader_idx_N' to the name itself; log it "
                               "without that suffix, or pass add_dataloader_idx=False to keep your own name.")
        stage = stage_of(fx)
        suffix = f"/dataloader_idx_{self.dataloader_idx}" \
            if add_dataloader_idx and self.dataloader_idx is not None and stage != "train" else ""
        entry = self._entry(fx, name, stage, on_step, on_epoch, prog_bar, logger, reduce_fx, sync_dist, suffix)
        if self.dataloader_idx is not None:
            entry.logged_from.add(self.dataloader_idx)
        if is_metric(value):
            self._log_metric_object(entry, value)
            return
        tensor = _as_scalar(name, value)
        if entry.on_step:
            self._log_step_value(entry, tensor, sync_dist)
        if entry.on_epoch:
            self._accumulate(entry, tensor, batch_size or self.current_batch_size or 1)

    def _log_step_value(self, entry: _Entry, tensor: torch.Tensor, sync_dist: bool) -> None:
        key = entry.keys()[0]
        if sync_dist and entry.stage == "train":
            self._pending_steps[key] = (entry, tensor.detach())  # published by the next sync_pending()
            return
        if sync_dist and (entry.stage, entry.name) not in self._warned:
            self._warned.add((entry.stage, entry.name))
            rank_zero_warn(f"self.log({entry.name!r}, on_step=True, sync_dist=True) during {entry.stage}: the "
                           f"step value is this rank's own, not synced (evaluation shards may be uneven, so a "
                           f"per-batch collective could hang); the epoch value is synced exactly.")
        if entry.stage == "train":
            self._publish(entry, key, tensor, to_logger=True)
        else:  # Lightning: an evaluation step value goes to the logger (one row per batch), not to the
            self._publish_eval_step(entry, key, tensor)  # callback metrics, which hold epoch values

    def _publish_eval_step(self, entry: _Entry, key: str, tensor: torch.Tensor) -> None:
        scalar = tensor.detach().float()
        if entry.prog_bar:
            self._unread_bar[key] = scalar
        if entry.logger:
            self._eval_step_logs[key] = scalar
            self.logged_metrics[key] = scalar

    def _entry(self, fx: str, name: str, stage: str, on_step: bool, on_epoch: bool, prog_bar: bool,
               logger: bool, reduce_fx: Any, sync_dist: bool, suffix: str = "") -> _Entry:
        reduce_name = _reduce_name(name, reduce_fx)
        entry = self._entries.get((stage, name + suffix))
        if entry is None:
            entry = _Entry(fx, name, stage, on_step, on_epoch, prog_bar, logger, reduce_name, sync_dist,
                           suffix=suffix)
            self._entries[(stage, name + suffix)] = entry
        elif entry.fx == fx and (entry.on_step, entry.on_epoch, entry.prog_bar, entry.logger, entry.reduce_fx,
                                 entry.sync_dist) != (on_step, on_epoch, prog_bar, logger, reduce_name, sync_dist):
            raise LoggingError(f"self.log({name!r}, ...) was called twice in {fx} with different options; one name "
                               "keeps one set of options (on_step, on_epoch, prog_bar, logger, reduce_fx, sync_dist) "
                               "within a hook.")
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
            extreme = torch.maximum if entry.reduce_fx == "max" else torch.minimum
            entry.total = extreme(entry.total, value)
        entry.weight += batch_size
        entry.pending_epoch = True

    def _publish(self, entry: _Entry, key: str, value: torch.Tensor, to_logger: bool) -> None:
        scalar = value.detach().float()  # on its device, as Lightning keeps it: no wait for the device here
        self.callback_metrics[key] = scalar
        self.callback_metrics[entry.full_name] = scalar
        if entry.prog_bar:
            self._unread_bar[key] = scalar
        if to_logger and entry.logger:
            self._step_logs[key] = scalar
            self.logged_metrics[key] = scalar  # live, as Lightning's: hooks may read it

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The `prog_bar=True` values as floats; values logged since the last read are converted now."""
        if self._unread_bar:
            unread, self._unread_bar = self._unread_bar, {}
            self._progress_bar_metrics.update(_floats(unread))
        return self._progress_bar_metrics

    # ------------------------------------------------------------------ loop interface
    def sync_pending(self) -> None:
        """Reduce every step value logged with sync_dist since the last call, in one collective,
        and publish them. Every rank must call it at the same point of the loop."""
        if not self._pending_steps:
            return
        pending = sorted(self._pending_steps.items())
        self._pending_steps = {}
        requests: list[_Request] = [("sum", _f64(1.0))]  # the sum of ones counts the ranks
        for _, (entry, value) in pending:
            requests.append(("sum" if entry.reduce_fx == "mean" else entry.reduce_fx, _f64(value)))
        reduced = self._reduce_many(requests)
        ranks = reduced[0]
        for (key, (entry, _)), value in zip(pending, reduced[1:]):
            self._publish(entry, key, value / ranks if entry.reduce_fx == "mean" else value, to_logger=True)

    def reset_stage(self, stage: str) -> None:
        """Forget epoch accumulators of `stage` (called at the start of its epoch). The torchmetrics
        objects it logged are not reset here: `reset_metric_objects` did that once, when the stage's
        epoch ended."""
        for key in [k for k in self._entries if k[0] == stage]:
            del self._entries[key]

    def reset_metric_objects(self, stage: str) -> None:
        """Reset the torchmetrics objects `stage` logged, once per epoch, where Lightning resets them:
        after the training epoch's end hooks, after an evaluation's `on_*_end` hooks (so those hooks
        may still call `metric.compute()`)."""
        for (entry_stage, _), entry in self._entries.items():
            if entry_stage == stage and entry.metric is not None and hasattr(entry.metric, "reset"):
                entry.metric.reset()

    def clear_views(self) -> None:
        """Start the three metrics dicts afresh and empty the logger queue (a new stage starts, or the
        sanity check ended: Lightning keeps nothing of it). New dicts, as Lightning's: a user who kept
        `trainer.callback_metrics` from `fit()` still reads the fit's values after `test()`."""
        self.callback_metrics, self.logged_metrics, self._progress_bar_metrics = {}, {}, {}
        self._unread_bar.clear()
        self._step_logs.clear()
        self._eval_step_logs.clear()
        self._pending_steps.clear()
        self._entries.clear()

    def stage_results(self, stage: str, dataloader_idx: int | None) -> dict[str, float]:
        """What `validate()`/`test()` return for one dataloader: the epoch-level values it logged
        (with or without its `/dataloader_idx_N` suffix), plus those logged outside any dataloader
        (in the epoch-end hooks), as in Lightning."""
        suffix = f"/dataloader_idx_{dataloader_idx}" if dataloader_idx is not None else None
        results = {}
        for (entry_stage, _), entry in sorted(self._entries.items()):
            if entry_stage != stage or not entry.on_epoch or (entry.suffix and entry.suffix != suffix):
                continue
            if not entry.suffix and entry.logged_from and dataloader_idx is not None \
                    and dataloader_idx not in entry.logged_from:
                continue  # logged by another dataloader under a name without its index
            key = entry.keys()[1]
            if key in self.callback_metrics:
                results[key] = float(self.callback_metrics[key])
        return results

    def compute_epoch(self, stage: str, dataloader_idx: int | None = None, with_loaders: bool = True) -> None:
        """Aggregate what `stage` logged since the last call and publish it: plain values in one
        collective, then torchmetrics objects (each syncs itself), in sorted key order, so every
        rank issues the same collectives in the same order. With several evaluation dataloaders,
        `dataloader_idx` limits this to what that dataloader logged (Lightning publishes a
        dataloader's values as soon as it is done), and `with_loaders=False` leaves out everything
        the dataloaders logged (the sanity check never shows those)."""
        self.sync_pending()
        due = [entry for key, entry in sorted(self._entries.items()) if key[0] == stage and entry.pending_epoch
               and (dataloader_idx is None or dataloader_idx in entry.logged_from)
               and (with_loaders or not entry.logged_from)]
        for entry in due:
            entry.pending_epoch = False
        plain = [entry for entry in due if entry.metric is None]
        values = dict(zip((entry.full_name for entry in plain), self._plain_epoch_values(plain)))
        for entry in due:
            value = values[entry.full_name] if entry.metric is None else self._metric_epoch_value(entry)
            self._publish(entry, entry.keys()[1], value, to_logger=True)
            if stage != "train" and entry.on_step and entry.on_epoch:
                self.callback_metrics.pop(entry.keys()[0], None)  # evaluation keeps only the epoch value

    def _plain_epoch_values(self, entries: list[_Entry]) -> list[torch.Tensor]:
        """Epoch values of self.log'd numbers; the sync_dist ones reduced in one collective.
        Totals accumulate where they were logged (on the GPU, no sync per step) and come to the
        CPU here, once an epoch, next to the CPU batch-size weights they are stacked with."""
        totals = [_f64(_accumulated(entry)) for entry in entries]
        requests: list[_Request] = []
        for entry, total in zip(entries, totals):
            if entry.sync_dist:
                requests.append(("sum" if entry.reduce_fx == "mean" else entry.reduce_fx, total))
                if entry.reduce_fx == "mean":
                    requests.append(("sum", _f64(entry.weight)))
        reduced = iter(self._reduce_many(requests) if requests else [])
        values = []
        for entry, total in zip(entries, totals):
            if entry.sync_dist:
                total = next(reduced)
            if entry.reduce_fx == "mean":
                total = total / (next(reduced) if entry.sync_dist else _f64(entry.weight))
            values.append(total)
        return values

    @staticmethod
    def _metric_epoch_value(entry: _Entry) -> torch.Tensor:
        return _as_scalar(entry.name, entry.metric.compute())  # torchmetrics syncs its states here

    def _reduce_many(self, requests: list[_Request]) -> list[torch.Tensor]:
        """Reduce scalars of mixed ops over ranks in ONE all-reduce: sums stacked as they are,
        max/min values placed in this rank's row of a (world, k) block of zeros, so summing
        gathers them (x + 0 is exact) and each rank takes the max/min of the rows itself."""
        sums = [value for op, value in requests if op == "sum"]
        extremes = [(op, value) for op, value in requests if op != "sum"]
        if extremes and self._ranks is None:
            return self._reduce_two_collectives(requests)
        rank, world = (self._ranks.global_rank, self._ranks.world_size) if self._ranks else (0, 1)
        buffer = torch.zeros(len(sums) + world * len(extremes), dtype=torch.float64)
        buffer[:len(sums)] = torch.stack(sums) if sums else buffer[:0]
        if extremes:
            start = len(sums) + rank * len(extremes)
            buffer[start:start + len(extremes)] = torch.stack([value for _, value in extremes])
        reduced = self._reduce(buffer, reduce_op="sum").to(torch.float64)
        summed = iter(reduced[:len(sums)])
        rows = reduced[len(sums):].reshape(world, len(extremes))
        gathered = iter((rows[:, i].max() if op == "max" else rows[:, i].min()) for i, (op, _) in enumerate(extremes))
        return [next(summed) if op == "sum" else next(gathered) for op, _ in requests]

    def _reduce_two_collectives(self, requests: list[_Request]) -> list[torch.Tensor]:
        """Fallback without rank information: sums in one all-reduce, max/min (min negated) in one."""
        sums = [value for op, value in requests if op == "sum"]
        signed = [value if op == "max" else -value for op, value in requests if op != "sum"]
        summed = iter(self._reduce(torch.stack(sums), reduce_op="sum") if sums else ())
        maxed = iter(self._reduce(torch.stack(signed), reduce_op="max"))
        return [next(summed) if op == "sum" else (next(maxed) if op == "max" else -next(maxed)) for op, _ in requests]

    def epoch_keys(self, stage: str) -> list[str]:
        """The epoch-level keys `stage` logged (what `validate()`/`test()` return)."""
        return sorted(entry.keys()[1] for (entry_stage, _), entry in self._entries.items()
                      if entry_stage == stage and entry.on_epoch)

    def pop_eval_step_metrics(self) -> dict[str, float]:
        """The evaluation step values logged during the last batch (Lightning writes them per batch)."""
        metrics, self._eval_step_logs = self._eval_step_logs, {}
        return _floats(metrics)

    def drop_logger_metrics(self) -> None:
        """Forget the step values of a step that does not log (without reading them from the device)."""
        self._step_logs = {}

    def pop_logger_metrics(self) -> dict[str, float]:
        """Values due for the logger since the last call; the Trainer writes them on rank 0.
        Never a collective (rank 0 alone calls it when finalising loggers)."""
        metrics, self._step_logs = self._step_logs, {}
        return _floats(metrics)

    def state_dict(self) -> dict[str, Any]:
        return {"callback_metrics": {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                                     for k, v in self.callback_metrics.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.callback_metrics.update(state.get("callback_metrics", {}))


def _reduce_name(name: str, reduce_fx: Any) -> str:
    """Lightning's spellings: "mean"/"avg", "sum", "max", "min" (any case) or torch.mean/sum/max/min."""
    key = reduce_fx.lower() if isinstance(reduce_fx, str) else reduce_fx
    key = "mean" if key == "avg" else key
    if key not in _REDUCE_NAMES:
        raise LoggingError(f"self.log({name!r}, reduce_fx={reduce_fx!r}): expected one of 'mean', 'sum', 'max', "
                           "'min' (or torch.mean/sum/max/min).")
    return _REDUCE_NAMES[key]


def _accumulated(entry: _Entry) -> torch.Tensor:
    if entry.total is None:  # pending_epoch is only set together with a total
        raise RuntimeError(f"metric {entry.name!r} is due for its epoch value but has none; this is a bug.")
    return entry.total


def _floats(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """Python floats of scalar tensors, read from their device in one copy per device."""
    if not values:
        return {}
    by_device: dict[torch.device, list[str]] = {}
    for key, value in values.items():
        by_device.setdefault(value.device, []).append(key)
    floats: dict[str, float] = {}
    for keys in by_device.values():
        host = torch.stack([values[key].reshape(()).to(torch.float32) for key in keys]).cpu().tolist()
        floats.update(zip(keys, host))
    return floats


def _f64(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=torch.float64).reshape(())
    return torch.tensor(float(value), dtype=torch.float64)


def is_metric(value: Any) -> bool:
    return hasattr(value, "compute") and hasattr(value, "update") and hasattr(value, "reset")


def _as_scalar(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise LoggingError(f"self.log({name!r}, ...) needs a scalar; got a tensor of shape {tuple(value.shape)}.")
        return value.detach().reshape(())
    if isinstance(value, numbers.Real):  # bools included, as in Lightning
        return torch.tensor(float(value))
    # a ValueError, as Lightning raises for a value of the wrong kind
    raise LoggingError(f"self.log({name!r}, ...) got a {type(value).__name__}; expected a number, a scalar tensor "
                       "or a torchmetrics Metric.")
