"""What `self.log` stores: step values, when epoch values are due and synced, the three views
(`callback_metrics`, `logged_metrics`, the progress bar's) and what goes to the loggers.

Which hooks may log, and whether a value is logged per step or aggregated per epoch there unless
told, is Lightning's rule (trainer/log_rules.py). With both `on_step` and `on_epoch`, the logger
gets `name_step` and `name_epoch` while `callback_metrics[name]` holds the latest of the two.

One logged name and its epoch aggregate is a `MetricEntry` (trainer/metric_entry.py): exact
global aggregates (sums of value x batch size and of batch sizes, not a mean of per-rank means),
so at world size N an epoch value equals one process on the same data.

`sync_dist=True` values are reduced over ranks, so every rank must log the same sync_dist keys.
They are batched: everything due at one sync point travels in ONE all-reduce
(trainer/metric_sync.py), never one collective per key. The sync points are fixed places in the
loop that every rank reaches alike: `sync_pending()` after a training step's hooks, and
`compute_epoch()` at epoch end.

Evaluation shards may be uneven (one batch more on some ranks), so evaluation issues no
collective per batch: a step-level `sync_dist` value logged during validation/test is published
as this rank's own value (with a one-time warning) and only the epoch value is synced.
"""

from __future__ import annotations

from typing import Any

import torch

from strategies.rank_zero import rank_zero_warn
from trainer.log_rules import LoggingError, logging_levels
from trainer.metric_entry import MetricEntry, as_scalar, is_metric, reduce_fx_name, stage_of
from trainer.metric_sync import RankInfo, Reducer, Request, f64, reduce_many


class MetricStore:
    """Owned by the Trainer; `LightningModule.log` calls `log`. `reduce` is the strategy's.

    `ranks` (the strategy) lets max/min values share the single all-reduce with the sums; without
    it they take a second one.
    """

    def __init__(self, reduce: Reducer, ranks: RankInfo | None = None) -> None:
        self._reduce = reduce
        self._ranks = ranks
        self._entries: dict[tuple[str, str], MetricEntry] = {}
        # Values stay tensors (on the device) until someone reads them: turning one into a float
        # waits for the device, and a step that logs must not (values are read at log_every_n_steps,
        # when the progress bar refreshes, or when a user reads the dicts).
        self._step_logs: dict[str, torch.Tensor] = {}
        self._eval_step_logs: dict[str, torch.Tensor] = {}
        self._unread_bar: dict[str, torch.Tensor] = {}
        self._pending_steps: dict[str, tuple[MetricEntry, torch.Tensor]] = {}
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
        tensor = as_scalar(name, value)
        if entry.on_step:
            self._log_step_value(entry, tensor, sync_dist)
        if entry.on_epoch:
            entry.accumulate(tensor, batch_size or self.current_batch_size or 1)

    def _log_step_value(self, entry: MetricEntry, tensor: torch.Tensor, sync_dist: bool) -> None:
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

    def _publish_eval_step(self, entry: MetricEntry, key: str, tensor: torch.Tensor) -> None:
        scalar = tensor.detach().float()
        if entry.prog_bar:
            self._unread_bar[key] = scalar
        if entry.logger:
            self._eval_step_logs[key] = scalar
            self.logged_metrics[key] = scalar

    def _entry(self, fx: str, name: str, stage: str, on_step: bool, on_epoch: bool, prog_bar: bool,
               logger: bool, reduce_fx: Any, sync_dist: bool, suffix: str = "") -> MetricEntry:
        reduce_name = reduce_fx_name(name, reduce_fx)
        entry = self._entries.get((stage, name + suffix))
        if entry is None:
            entry = MetricEntry(fx, name, stage, on_step, on_epoch, prog_bar, logger, reduce_name, sync_dist,
                           suffix=suffix)
            self._entries[(stage, name + suffix)] = entry
        elif entry.fx == fx and (entry.on_step, entry.on_epoch, entry.prog_bar, entry.logger, entry.reduce_fx,
                                 entry.sync_dist) != (on_step, on_epoch, prog_bar, logger, reduce_name, sync_dist):
            raise LoggingError(f"self.log({name!r}, ...) was called twice in {fx} with different options; one name "
                               "keeps one set of options (on_step, on_epoch, prog_bar, logger, reduce_fx, sync_dist) "
                               "within a hook.")
        return entry

    def _log_metric_object(self, entry: MetricEntry, metric: Any) -> None:
        entry.metric = metric
        entry.pending_epoch = entry.on_epoch
        if entry.on_step:
            batch_value = getattr(metric, "_forward_cache", None)
            if batch_value is None:
                batch_value = metric.compute()
            self._publish(entry, entry.keys()[0], as_scalar(entry.name, batch_value), to_logger=True)

    def _publish(self, entry: MetricEntry, key: str, value: torch.Tensor, to_logger: bool) -> None:
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
        requests: list[Request] = [("sum", f64(1.0))]  # the sum of ones counts the ranks
        for _, (entry, value) in pending:
            requests.append(("sum" if entry.reduce_fx == "mean" else entry.reduce_fx, f64(value)))
        reduced = reduce_many(self._reduce, self._ranks, requests)
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

    def _plain_epoch_values(self, entries: list[MetricEntry]) -> list[torch.Tensor]:
        """Epoch values of self.log'd numbers; the sync_dist ones reduced in one collective.
        Totals accumulate where they were logged (on the GPU, no sync per step) and come to the
        CPU here, once an epoch, next to the CPU batch-size weights they are stacked with."""
        totals = [f64(entry.epoch_total()) for entry in entries]
        requests: list[Request] = []
        for entry, total in zip(entries, totals):
            if entry.sync_dist:
                requests.append(("sum" if entry.reduce_fx == "mean" else entry.reduce_fx, total))
                if entry.reduce_fx == "mean":
                    requests.append(("sum", f64(entry.weight)))
        reduced = iter(reduce_many(self._reduce, self._ranks, requests) if requests else [])
        values = []
        for entry, total in zip(entries, totals):
            if entry.sync_dist:
                total = next(reduced)
            if entry.reduce_fx == "mean":
                total = total / (next(reduced) if entry.sync_dist else f64(entry.weight))
            values.append(total)
        return values

    @staticmethod
    def _metric_epoch_value(entry: MetricEntry) -> torch.Tensor:
        return as_scalar(entry.name, entry.metric.compute())  # torchmetrics syncs its states here

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
