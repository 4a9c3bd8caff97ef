"""Epochs and batches, when to validate, when to stop. Reads top to bottom (Lightning's order):

    [sanity check: a few validation batches, nothing logged, RNG untouched]
    train_dataloader(); on_train_start
    for epoch in epochs:
        sampler.set_epoch(epoch); on_train_epoch_start
        for batch in the epoch's batches:
            batch-transfer hooks; on_train_batch_start -> run_training_batch
            -> "step" schedulers (and "epoch" ones at the epoch's last batch) -> on_train_batch_end -> log
            validate if val_check_interval says so; plateau "step" schedulers; stop if told to
        epoch metrics; on_train_epoch_end (callbacks, module, then checkpointing/early stopping);
        plateau "epoch" schedulers
    on_train_end
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from torch import nn

from strategies.rank_zero import rank_zero_info, rank_zero_warn
from trainer.data_sources import INFINITE, unlimited_if_negative
from trainer.stage import Stage
from trainer.batch_counts import num_batches
from trainer.loops.batches import iterate_limited, open_loader, set_sampler_epoch
from trainer.loops.signatures import check_training_signature
from trainer.loops.step_iterator import StepIterator, takes_dataloader_iter
from trainer.loops.evaluation import has_step, run_evaluation, run_sanity_check
from trainer.loops.metric_writes import write_logger_metrics
from trainer.loops.preemption import stop_if_preempted
from trainer.loops.resume import ResumePoint
from trainer.loops.training_step import run_training_batch, step_schedulers
from trainer.schedule import (can_stop_early, check_val_interval, fit_done, logs_at_step, max_steps_reached,
                              time_is_up, validates_in_epoch, validation_due)


def run_fit(parts: Stage, module: nn.Module, resume: ResumePoint) -> None:
    """The fit from the Trainer's progress on; `resume`: what a checkpoint restored beyond it (or an empty
    point: a fit may also go on from where an earlier one stopped). User hooks get `parts.trainer`."""
    progress, run, callbacks = parts.progress, parts.fit_run, parts.callbacks
    check_training_signature(module)
    if _should_sanity_check(parts, module):
        run_sanity_check(parts, module)
        if validates_in_epoch(parts):  # the loaders it requested count as this epoch's validation loaders
            run.val_loader_epoch = progress.current_epoch
    parts.status.stage = "train"
    if parts.live.limit_train_batches == 0:
        rank_zero_info("Trainer.fit stopped: limit_train_batches=0, no training batches.")
        return
    train_loader = _request_train_loader(parts)
    if parts.num_training_batches == 0:
        open_loader(train_loader)  # as Lightning: its iterator is built (a draw) before the batches are counted
        rank_zero_warn("The training dataloader yields no batches (an empty dataset, or drop_last with fewer samples "
                       "than batch_size per rank): nothing to train on.")
        return
    resume.skip_finished_epoch(parts)
    if fit_done(parts):  # an earlier fit (or the checkpoint) reached max_epochs/max_steps: Lightning then runs
        open_loader(train_loader)  # no training, not even on_train_start, but has built the loader's iterator
        return                     # (the DataLoader's seed drawn from torch's generator): drawn and dropped here
    if validates_in_epoch(parts):  # the first epoch validates: its loaders now (the progress bar shows them)
        _ensure_val_loaders(parts, module)
    check_val_interval(parts)
    resume.continue_sample_stream(parts, train_loader)
    _count_skipped_validation(parts, module, resume)
    resuming = resume.pending(progress)
    run.restarting, run.started_at = progress.batch_in_epoch > 0, time.monotonic()
    if progress.batch_in_epoch == 0:
        parts.metrics.reset_stage("train")
    _warn_about_eval_mode(module)
    batches = None if resuming else _open_first_epoch(parts, train_loader)
    callbacks.call("on_train_start", parts.trainer, module)
    while not fit_done(parts):
        reloaded = _maybe_reload(parts, train_loader)
        if reloaded is not train_loader:
            batches, train_loader = None, reloaded
        if batches is None:  # the epoch's sampler epoch first: a loader's workers read indices at once
            set_sampler_epoch(train_loader, progress.current_epoch)
            batches = (resume.open(parts, train_loader) if resuming
                       else iterate_limited(parts, train_loader, "train"))
        with parts.profiler.profile("run_training_epoch"):
            _run_epoch(parts, module, train_loader, batches)
        batches, resuming, run.restarting = None, False, False
        progress.current_epoch += 1
        progress.batch_in_epoch = progress.samples_in_epoch = 0
        if not fit_done(parts):
            stop_if_preempted(parts)  # between two epochs
    run.nonfinite_watch.check(parts.strategy)
    callbacks.call("on_train_end", parts.trainer, module)


def _should_sanity_check(parts: Stage, module: nn.Module) -> bool:
    """Lightning runs `num_sanity_val_steps` validation batches before training, to fail fast on a
    broken validation_step; a resume mid-epoch skips it."""
    live = parts.live
    return (live.num_sanity_val_steps != 0 and live.limit_val_batches != 0 and has_step(module, "validate")
            and parts.data.val_defined(parts.datamodule, parts.module) and parts.progress.batch_in_epoch == 0)


def _request_train_loader(parts: Stage, reload: bool = False) -> Any:
    loaders = parts.data.loaders.get("train") if not reload else None  # configure_optimizers may have asked
    # one entry: a loader or a CombinedLoader
    loaders = loaders or parts.data.request("train", parts.loader_source())
    parts.data.counts.train = unlimited_if_negative(num_batches(parts.live, loaders[0], "train"))
    parts.fit_run.train_loader_epoch = parts.progress.current_epoch
    return loaders[0]


def _request_val_loaders(parts: Stage, module: nn.Module) -> None:
    if "validate" not in parts.data.loaders and has_step(module, "validate") and parts.enable_validation:
        parts.data.request("validate", parts.loader_source(), required=False)
    loaders = parts.data.loaders.get("validate", []) if has_step(module, "validate") else []
    parts.data.counts.set_val(parts.status.fn, [num_batches(parts.live, loader, "validate") for loader in loaders])


def _maybe_reload(parts: Stage, train_loader: Any) -> Any:
    """reload_dataloaders_every_n_epochs=n: ask the hook for a fresh training loader every n epochs
    (the validation loaders count their own epochs: `_ensure_val_loaders`)."""
    every = parts.live.reload_dataloaders_every_n_epochs
    if not every or parts.progress.current_epoch - parts.fit_run.train_loader_epoch < every:
        return train_loader
    return _request_train_loader(parts, reload=True)


def _ensure_val_loaders(parts: Stage, module: nn.Module) -> None:
    """Lightning's timing: fit requests the validation loaders when a validation is first due, and
    again at a due validation once `reload_dataloaders_every_n_epochs` epochs have passed since the
    last request; so with validation every few epochs they reload on their own schedule."""
    run, every, epoch = parts.fit_run, parts.live.reload_dataloaders_every_n_epochs, parts.progress.current_epoch
    last = run.val_loader_epoch
    reload_due = bool(every) and (last is None or epoch - last >= every)
    if "validate" in parts.data.loaders and not reload_due:
        return
    parts.data.loaders.pop("validate", None)
    _request_val_loaders(parts, module)
    run.val_loader_epoch = epoch


def _open_first_epoch(parts: Stage, train_loader: Any) -> Iterator[tuple[int, Any]] | None:
    """The first epoch's batches, their iterator created before `on_train_start` as Lightning does. A fit
    that goes on from an earlier fit's epoch (not from a checkpoint) gets None: Lightning creates a second
    iterator when that epoch starts, and the first one's draw from torch's generator is gone all the same."""
    epoch = parts.progress.current_epoch
    if epoch > 0 and parts.attached.ckpt_path is None:
        open_loader(train_loader)  # drawn and dropped, as Lightning's; the epoch sets its sampler and opens anew
        return None
    set_sampler_epoch(train_loader, epoch)  # before: a loader's workers read indices at once
    return iterate_limited(parts, train_loader, "train", opened=open_loader(train_loader))


def _run_epoch(parts: Stage, module: nn.Module, train_loader: Any, batches: Iterator[tuple[int, Any]]) -> None:
    """One training epoch over `batches`, the epoch's `(batch_idx, batch)` pairs from
    `progress.batch_in_epoch` on (a resumed epoch's first index is the checkpoint's)."""
    state, run, callbacks, store, trainer = parts.progress, parts.fit_run, parts.callbacks, parts.metrics, parts.trainer
    live, profiler = parts.live, parts.profiler
    if state.batch_in_epoch == 0:  # a run resumed mid-epoch continues the epoch: no new epoch starts
        state.scheduler_steps_in_epoch = state.fit_validation.total = 0  # Lightning's per-epoch counters
        callbacks.call("on_train_epoch_start", trainer, module)
    total = parts.num_training_batches
    # the batch that ran last: in a resumed epoch, the checkpoint's (an unsized loader may have nothing left)
    last_idx, stopped = state.batch_in_epoch - 1, False
    for batch_idx, batch in _batches_or_steps(module, batches):
        last_idx = batch_idx
        if total != INFINITE:  # without a length, the batches were fetched ahead and told it (batches.py)
            run.is_last_batch = batch_idx + 1 == total
        elif isinstance(batch, StepIterator):  # the step fetches its own: known after it (below)
            run.is_last_batch = False
        hook_batch = batch.last[0] if isinstance(batch, StepIterator) else batch
        window_end = (batch_idx + 1) % live.accumulate_grad_batches == 0 or batch_idx + 1 == total
        if batch is None:  # Lightning: no batch-start hook and no step; the batch's end hooks get outputs=None
            rank_zero_warn("train_dataloader yielded None as a batch: it is skipped (no on_train_batch_start, no "
                           "training_step; on_train_batch_end gets outputs=None). Fine if the data skips it on "
                           "purpose; otherwise check the dataset or its collate_fn.")
            output = None
        elif callbacks.call("on_train_batch_start", trainer, module, hook_batch, batch_idx) == -1:
            step_schedulers(parts, module, "epoch", plateau=False)  # Lightning: the epoch ends here
            last_idx, stopped = (int(total) - 1 if total != INFINITE else batch_idx), True
            break  # Lightning: returning -1 ends the epoch early (counted as its last batch)
        else:
            with profiler.profile("run_training_batch"):
                output = run_training_batch(parts, module, batch, batch_idx, window_end)
        if isinstance(batch, StepIterator):  # the step fetched its own batches: follow where it got to
            hook_batch, batch_idx, _ = batch.last
            last_idx, run.is_last_batch = batch_idx, not batch.has_more()
        store.sync_pending()  # the step's sync_dist values, one collective, before callbacks read them
        state.batch_in_epoch = batch_idx + 1
        state.samples_in_epoch += _global_batch_size(parts, train_loader)
        if window_end:
            step_schedulers(parts, module, "step", batch_idx=batch_idx, plateau=False)
        if run.is_last_batch:
            step_schedulers(parts, module, "epoch", plateau=False)
        state.step_in_flight, state.in_batch_end = window_end, True
        callbacks.call("on_train_batch_end", trainer, module, output, hook_batch, batch_idx)
        state.in_batch_end = False
        store.sync_pending()  # what on_train_batch_end logged with sync_dist (no-op otherwise)
        _log_step(parts, module, window_end)
        if _should_validate(parts, batch_idx, module):
            if window_end:
                callbacks.call_module("on_validation_model_zero_grad", module)
            run_evaluation(parts, module, parts.data.loaders.get("validate", []), "validate")
        if window_end:
            step_schedulers(parts, module, "step", batch_idx=batch_idx, plateau=True)
            state.stepped_batches += 1
        state.step_in_flight = False
        if time_is_up(parts):
            run.should_stop = True
        if max_steps_reached(parts) or (run.should_stop and can_stop_early(parts)):
            stopped = True
            break
        if window_end and not run.is_last_batch:  # an epoch's last batch: its end hooks run first
            stop_if_preempted(parts)
    completed = last_idx + 1 == total or (not stopped and last_idx >= 0)
    if total == INFINITE and not stopped and last_idx >= 0 \
            and _should_validate(parts, last_idx, module, epoch_ended=True):
        run_evaluation(parts, module, parts.data.loaders.get("validate", []), "validate")
    run.nonfinite_watch.check(parts.strategy)
    # The epoch's aggregates are published three times, each for a reader of them: before the callbacks'
    # on_train_epoch_end (they read what the steps logged), again between the module's own hook and the
    # monitoring callbacks (the module may log there; checkpointing and early stopping must see it), and
    # once more after them (a callback may have logged last).
    store.compute_epoch("train")
    callbacks.call_epoch_end("on_train_epoch_end", trainer, module,
                             before_monitoring=lambda: store.compute_epoch("train"))
    store.compute_epoch("train")
    store.reset_metric_objects("train")
    if completed:
        step_schedulers(parts, module, "epoch", plateau=True)
    write_logger_metrics(parts, step=max(0, state.stepped_batches - 1))
    store.reset_stage("train")  # the next epoch aggregates afresh (what on_train_start logged counted in the first)


def _batches_or_steps(module: nn.Module, batches: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
    """(batch_idx, batch) pairs; for a `training_step(self, dataloader_iter)`, one StepIterator per
    step while batches remain, paired with the index of the batch fetched last."""
    if not takes_dataloader_iter(module.training_step):
        yield from batches
        return
    steps = StepIterator((batch_idx, batch, 0) for batch_idx, batch in batches)
    while steps.has_more():
        yield steps.last[1], steps


def _log_step(parts: Stage, module: nn.Module, window_end: bool) -> None:
    """Step metrics go to the logger every `log_every_n_steps` optimizer steps (Lightning counts
    batches that stepped; accumulating micro-batches log nothing)."""
    automatic = bool(getattr(module, "automatic_optimization", True))
    if automatic and not window_end:
        return
    run = parts.fit_run
    if logs_at_step(parts.live.log_every_n_steps, parts.progress.stepped_batches, run.should_stop):
        run.nonfinite_watch.check(parts.strategy)  # values are read from the device here anyway
        write_logger_metrics(parts)
    else:
        parts.metrics.drop_logger_metrics()


def _should_validate(parts: Stage, batch_idx: int, module: nn.Module, epoch_ended: bool = False) -> bool:
    """Whether a validation runs after this batch; when one is due, its loaders are (re)requested first."""
    if not has_step(module, "validate") or not validates_in_epoch(parts) \
            or not validation_due(parts, batch_idx, epoch_ended):
        return False
    _ensure_val_loaders(parts, module)
    return any(parts.data.counts.val_of(parts.status.fn))


def _warn_about_eval_mode(module: nn.Module) -> None:
    """Training starts with the modes the module's parts have; one left in eval mode (e.g. frozen
    by hand) keeps dropout and batch norm in evaluation behaviour, which is often a mistake."""
    in_eval = [name or type(module).__name__ for name, part in module.named_modules() if not part.training]
    if in_eval:
        shown = ", ".join(in_eval[:3]) + (f", ... ({len(in_eval)} in all)" if len(in_eval) > 3 else "")
        rank_zero_warn(f"Training starts with {len(in_eval)} module(s) in eval mode ({shown}): their dropout and "
                       "batch norm layers behave as in evaluation. Call .train() on them unless that is intended.")


def _count_skipped_validation(parts: Stage, module: nn.Module, resume: ResumePoint) -> None:
    """A checkpoint written in `on_train_batch_end`, before that batch's validation, resumes at the
    next batch without running it; Lightning counts that validation's batches as run all the same."""
    progress = parts.progress
    if not resume.in_batch_end or progress.batch_in_epoch == 0 \
            or not _should_validate(parts, progress.batch_in_epoch - 1, module):
        return
    batches = max(parts.data.counts.val_of(parts.status.fn), default=0)
    if batches != INFINITE:
        progress.fit_validation.total += int(batches)
        progress.fit_validation.current += int(batches)
        progress.fit_validation.is_last_batch = True


def _global_batch_size(parts: Stage, loader: Any) -> int:
    """Samples this step consumed on all ranks (the sampler pads, so every rank's batch is alike)."""
    per_rank = parts.metrics.current_batch_size or getattr(loader, "batch_size", None) or 1
    return int(per_rank) * parts.strategy.world_size
