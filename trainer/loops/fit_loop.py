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
from typing import Any, TYPE_CHECKING

from torch import nn

from strategies.rank_zero import rank_zero_info, rank_zero_warn
from trainer.loops.batches import iterate_limited, num_batches, open_loader, set_sampler_epoch
from trainer.loops.signatures import check_training_signature
from trainer.loops.step_iterator import StepIterator, takes_dataloader_iter
from trainer.loops.evaluation import has_step, run_evaluation, run_sanity_check
from trainer.loops.nonfinite import NonFiniteWatch
from trainer.loops.preemption import stop_if_preempted
from trainer.loops.resume import ResumePoint, resumable_sampler
from trainer.loops.training_step import run_training_batch, step_schedulers

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def run_fit(trainer: Trainer, module: nn.Module) -> None:
    state, callbacks = trainer.loop_state, trainer.callback_list
    state.validated_in_fit = False
    settle_max_epochs(trainer)
    check_training_signature(module)
    state.val_loader_epoch = None
    if _should_sanity_check(trainer, module):
        run_sanity_check(trainer, module)
        if validates_in_epoch(trainer):  # the loaders it requested count as this epoch's validation loaders
            state.val_loader_epoch = trainer.current_epoch
    trainer.state.stage = "train"
    if trainer.limit_train_batches == 0:
        rank_zero_info("Trainer.fit stopped: limit_train_batches=0, no training batches.")
        return
    train_loader = _request_train_loader(trainer)
    if trainer.num_training_batches == 0:
        rank_zero_warn("The training dataloader yields no batches (an empty dataset, or drop_last with fewer samples "
                       "than batch_size per rank): nothing to train on.")
        return
    _advance_past_finished_epoch(trainer)
    if _fit_done(trainer):  # an earlier fit (or the checkpoint) reached max_epochs/max_steps: Lightning
        return              # then runs no training at all, not even on_train_start/on_train_end
    if validates_in_epoch(trainer):  # the first epoch validates: its loaders now (the progress bar shows them)
        _ensure_val_loaders(trainer, module)
    _check_val_interval(trainer)
    _continue_sample_stream(trainer, train_loader)
    _count_skipped_validation(trainer, module)
    resume = ResumePoint.take(state)  # the checkpoint's position inside the first epoch, if any
    state.restarting = state.batch_in_epoch > 0
    trainer.fit_started_at = time.monotonic()
    trainer.nonfinite_watch = NonFiniteWatch()
    if state.batch_in_epoch == 0:
        trainer.metric_store.reset_stage("train")
    _warn_about_eval_mode(module)
    opened = _open_first_epoch(trainer, train_loader) if resume is None else None
    callbacks.call("on_train_start", trainer, module)
    while not _fit_done(trainer):
        reloaded = _maybe_reload(trainer, module, train_loader)
        opened, train_loader = (opened if reloaded is train_loader else None), reloaded
        with trainer.profiler.profile("run_training_epoch"):
            _run_epoch(trainer, module, train_loader, resume, opened)
        resume, state.restarting, opened = None, False, None
        state.current_epoch += 1
        state.batch_in_epoch = state.samples_in_epoch = 0
        if not _fit_done(trainer):
            stop_if_preempted(trainer)  # between two epochs
    trainer.nonfinite_watch.check(trainer)
    callbacks.call("on_train_end", trainer, module)


def _should_sanity_check(trainer: Trainer, module: nn.Module) -> bool:
    """Lightning runs `num_sanity_val_steps` validation batches before training, to fail fast on a
    broken validation_step; a resume mid-epoch skips it."""
    return (trainer.num_sanity_val_steps != 0 and trainer.limit_val_batches != 0 and has_step(module, "validate")
            and trainer.data.val_defined(trainer) and trainer.loop_state.batch_in_epoch == 0)


def _request_train_loader(trainer: Trainer, reload: bool = False) -> Any:
    loaders = trainer.data.loaders.get("train") if not reload else None  # configure_optimizers may have asked
    loaders = loaders or trainer.data.request(trainer, "train")  # one entry: a loader or a CombinedLoader
    total = num_batches(trainer, loaders[0], "train")
    trainer.num_training_batches = float("inf") if total < 0 else total
    trainer.loop_state.train_loader_epoch = trainer.current_epoch
    return loaders[0]


def _request_val_loaders(trainer: Trainer, module: nn.Module) -> None:
    if "validate" not in trainer.data.loaders and has_step(module, "validate") and trainer.enable_validation:
        trainer.data.request(trainer, "validate", required=False)
    loaders = trainer.data.loaders.get("validate", []) if has_step(module, "validate") else []
    trainer.num_val_batches = [_as_count(num_batches(trainer, loader, "validate")) for loader in loaders]


def _maybe_reload(trainer: Trainer, module: nn.Module, train_loader: Any) -> Any:
    """reload_dataloaders_every_n_epochs=n: ask the hook for a fresh training loader every n epochs
    (the validation loaders count their own epochs: `_ensure_val_loaders`)."""
    every = trainer.reload_dataloaders_every_n_epochs
    if not every or trainer.current_epoch - trainer.loop_state.train_loader_epoch < every:
        return train_loader
    return _request_train_loader(trainer, reload=True)


def _ensure_val_loaders(trainer: Trainer, module: nn.Module) -> None:
    """Lightning's timing: fit requests the validation loaders when a validation is first due, and
    again at a due validation once `reload_dataloaders_every_n_epochs` epochs have passed since the
    last request; so with validation every few epochs they reload on their own schedule."""
    state, every = trainer.loop_state, trainer.reload_dataloaders_every_n_epochs
    last = state.val_loader_epoch
    reload_due = bool(every) and (last is None or trainer.current_epoch - last >= every)
    if "validate" in trainer.data.loaders and not reload_due:
        return
    trainer.data.loaders.pop("validate", None)
    _request_val_loaders(trainer, module)
    state.val_loader_epoch = trainer.current_epoch


def _as_count(total: int) -> int | float:
    return float("inf") if total < 0 else total


def _open_first_epoch(trainer: Trainer, train_loader: Any) -> Any:
    """The first epoch's iterator, created before `on_train_start` as Lightning does. A fit that goes on
    from an earlier fit's epoch (not from a checkpoint) gets None: Lightning creates a second iterator when
    that epoch starts, and the first one's draw from torch's generator is gone all the same."""
    if trainer.current_epoch > 0 and trainer.ckpt_path is None:
        open_loader(train_loader)  # drawn and dropped, as Lightning's; the epoch sets its sampler and opens anew
        return None
    set_sampler_epoch(train_loader, trainer.current_epoch)  # before: a loader's workers read indices at once
    return open_loader(train_loader)


def _run_epoch(trainer: Trainer, module: nn.Module, train_loader: Any, resume: ResumePoint | None,
               opened: Any = None) -> None:
    """One training epoch; `resume`: where the first epoch of a resumed fit picks up (trainer/loops/resume.py);
    `opened`: the loader's iterator if it was created ahead."""
    state, callbacks, store = trainer.loop_state, trainer.callback_list, trainer.metric_store
    if opened is None:  # an iterator opened ahead had its sampler's epoch set first (once per epoch, as Lightning)
        set_sampler_epoch(train_loader, state.current_epoch)
    batches = resume.open(trainer, train_loader) if resume is not None else iterate_limited(trainer, train_loader,
                                                                                            "train", opened=opened)
    if state.batch_in_epoch == 0:  # a run resumed mid-epoch continues the epoch: no new epoch starts
        state.scheduler_steps_in_epoch = state.fit_validation.total = 0  # Lightning's per-epoch counters
        callbacks.call("on_train_epoch_start", trainer, module)
    total = trainer.num_training_batches
    # the batch that ran last: in a resumed epoch, the checkpoint's (an unsized loader may have nothing left)
    last_idx, stopped = state.batch_in_epoch - 1, False
    for batch_idx, batch in _batches_or_steps(module, batches):
        last_idx = batch_idx
        state.is_last_batch = batch_idx + 1 == total
        hook_batch = batch.last[0] if isinstance(batch, StepIterator) else batch
        window_end = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or batch_idx + 1 == total
        if batch is None:  # Lightning: no batch-start hook and no step; the batch's end hooks get outputs=None
            rank_zero_warn("train_dataloader yielded None as a batch: it is skipped (no on_train_batch_start, no "
                           "training_step; on_train_batch_end gets outputs=None). Fine if the data skips it on "
                           "purpose; otherwise check the dataset or its collate_fn.")
            output = None
        elif callbacks.call("on_train_batch_start", trainer, module, hook_batch, batch_idx) == -1:
            step_schedulers(trainer, module, "epoch", plateau=False)  # Lightning: the epoch ends here
            last_idx, stopped = (int(total) - 1 if total != float("inf") else batch_idx), True
            break  # Lightning: returning -1 ends the epoch early (counted as its last batch)
        else:
            with trainer.profiler.profile("run_training_batch"):
                output = run_training_batch(trainer, module, batch, batch_idx, window_end)
        if isinstance(batch, StepIterator):  # the step fetched its own batches: follow where it got to
            hook_batch, batch_idx, _ = batch.last
            last_idx, state.is_last_batch = batch_idx, not batch.has_more()
        store.sync_pending()  # the step's sync_dist values, one collective, before callbacks read them
        state.batch_in_epoch = batch_idx + 1
        state.samples_in_epoch += _global_batch_size(trainer, train_loader)
        if window_end:
            step_schedulers(trainer, module, "step", batch_idx=batch_idx, plateau=False)
        if state.is_last_batch:
            step_schedulers(trainer, module, "epoch", plateau=False)
        state.step_in_flight, state.in_batch_end = window_end, True
        callbacks.call("on_train_batch_end", trainer, module, output, hook_batch, batch_idx)
        state.in_batch_end = False
        store.sync_pending()  # what on_train_batch_end logged with sync_dist (no-op otherwise)
        _log_step(trainer, module, window_end)
        if _should_validate(trainer, batch_idx, module):
            if window_end:
                callbacks.call_module("on_validation_model_zero_grad", module)
            run_evaluation(trainer, module, trainer.data.loaders.get("validate", []), "validate")
        if window_end:
            step_schedulers(trainer, module, "step", batch_idx=batch_idx, plateau=True)
            state.stepped_batches += 1
        state.step_in_flight = False
        _check_time_limit(trainer)
        if _max_steps_reached(trainer) or (trainer.should_stop and _can_stop_early(trainer)):
            stopped = True
            break
        if window_end and not state.is_last_batch:  # an epoch's last batch: its end hooks run first
            stop_if_preempted(trainer)
    completed = last_idx + 1 == total or (not stopped and last_idx >= 0)
    if total == float("inf") and not stopped and last_idx >= 0 \
            and _should_validate(trainer, last_idx, module, epoch_ended=True):
        run_evaluation(trainer, module, trainer.data.loaders.get("validate", []), "validate")
    trainer.nonfinite_watch.check(trainer)
    store.compute_epoch("train")
    callbacks.call_epoch_end("on_train_epoch_end", trainer, module,
                             before_monitoring=lambda: store.compute_epoch("train"))
    store.compute_epoch("train")
    store.reset_metric_objects("train")
    if completed:
        step_schedulers(trainer, module, "epoch", plateau=True)
    trainer.write_logger_metrics(step=max(0, state.stepped_batches - 1))
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


def _log_step(trainer: Trainer, module: nn.Module, window_end: bool) -> None:
    """Step metrics go to the logger every `log_every_n_steps` optimizer steps (Lightning counts
    batches that stepped; accumulating micro-batches log nothing)."""
    automatic = bool(getattr(module, "automatic_optimization", True))
    if automatic and not window_end:
        return
    every = trainer.log_every_n_steps
    if every and ((trainer.loop_state.stepped_batches + 1) % every == 0 or trainer.should_stop):
        trainer.nonfinite_watch.check(trainer)  # values are read from the device here anyway
        trainer.write_logger_metrics()
    else:
        trainer.metric_store.drop_logger_metrics()


def validates_in_epoch(trainer: Trainer) -> bool:
    """Whether validation runs in the current training epoch (check_val_every_n_epoch)."""
    every_n_epochs = trainer.check_val_every_n_epoch
    due = every_n_epochs is None or (trainer.current_epoch + 1) % every_n_epochs == 0
    return bool(trainer.enable_validation) and due


def _should_validate(trainer: Trainer, batch_idx: int, module: nn.Module, epoch_ended: bool = False) -> bool:
    """Whether a validation runs after this batch; when one is due, its loaders are (re)requested first."""
    if not has_step(module, "validate") or not validates_in_epoch(trainer) \
            or not _validation_due(trainer, batch_idx, epoch_ended):
        return False
    _ensure_val_loaders(trainer, module)
    return any(trainer.num_val_batches)


def _validation_due(trainer: Trainer, batch_idx: int, epoch_ended: bool) -> bool:
    if trainer.should_stop and _can_stop_early(trainer):
        return True
    total, interval, every = trainer.num_training_batches, trainer.val_check_interval, validation_every(trainer)
    if every == float("inf"):
        return epoch_ended
    if total == float("inf"):
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
    if total == float("inf"):
        return float("inf")
    return max(1, int(total * interval))


def _check_val_interval(trainer: Trainer) -> None:
    """An int interval longer than the epoch would silently never validate (Lightning raises too)."""
    interval, total = trainer.val_check_interval, trainer.num_training_batches
    if total == float("inf") and isinstance(interval, float) and interval != 1.0:
        raise ValueError(f"val_check_interval={interval} is a fraction of an epoch, but the training data has no "
                         "length (an IterableDataset): use 1.0 (validate when the epoch ends) or an int number of "
                         "batches.")
    if isinstance(interval, int) and trainer.check_val_every_n_epoch is not None and total < interval \
            and trainer.limit_val_batches != 0:
        raise ValueError(f"val_check_interval={interval} batches exceeds the {total} training batches per epoch; "
                         "use a smaller int, a float fraction of the epoch, or check_val_every_n_epoch=None.")


def _can_stop_early(trainer: Trainer) -> bool:
    """`should_stop` is honoured only once min_epochs and min_steps are met (Lightning's rule)."""
    met_epochs = trainer.current_epoch >= (trainer.min_epochs or 0)
    met_steps = trainer.global_step >= (trainer.min_steps or 0)
    return met_epochs and met_steps


def _fit_done(trainer: Trainer) -> bool:
    if _max_steps_reached(trainer):
        return True
    max_epochs = effective_max_epochs(trainer)
    if max_epochs >= 0 and trainer.current_epoch >= max_epochs:
        return True
    if trainer.should_stop:
        if _can_stop_early(trainer):
            return True
        rank_zero_info(f"Trainer was signaled to stop but the required min_epochs={trainer.min_epochs} or "
                       f"min_steps={trainer.min_steps} has not been met; training continues until it is.")
    return False


def effective_max_epochs(trainer: Trainer) -> int:
    """Lightning's rule for `max_epochs=None`: no epoch limit when `max_steps` or `max_time` bounds
    the fit, otherwise 1000 epochs (`trainer.max_epochs` takes that value when fit starts)."""
    if trainer.max_epochs is not None:
        return int(trainer.max_epochs)
    return -1 if trainer.max_steps != -1 or trainer.max_time is not None else 1000


def settle_max_epochs(trainer: Trainer) -> None:
    """`max_epochs=None` becomes its value when fit starts (as in Lightning); falling back to 1000
    epochs, with nothing else bounding the fit, is worth a warning."""
    if trainer.max_epochs is not None:
        return
    trainer.max_epochs = effective_max_epochs(trainer)
    if trainer.max_epochs == 1000:
        rank_zero_warn("Trainer(max_epochs=None) with neither max_steps nor max_time: the fit stops after 1000 "
                       "epochs. Pass max_epochs=-1 to train without an epoch limit, or set the limit you want.")


def _warn_about_eval_mode(module: nn.Module) -> None:
    """Training starts with the modes the module's parts have; one left in eval mode (e.g. frozen
    by hand) keeps dropout and batch norm in evaluation behaviour, which is often a mistake."""
    in_eval = [name or type(module).__name__ for name, part in module.named_modules() if not part.training]
    if in_eval:
        shown = ", ".join(in_eval[:3]) + (f", ... ({len(in_eval)} in all)" if len(in_eval) > 3 else "")
        rank_zero_warn(f"Training starts with {len(in_eval)} module(s) in eval mode ({shown}): their dropout and "
                       "batch norm layers behave as in evaluation. Call .train() on them unless that is intended.")


def _max_steps_reached(trainer: Trainer) -> bool:
    return trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps


def _check_time_limit(trainer: Trainer) -> None:
    """max_time: stop at the first batch boundary past the deadline (Lightning's Timer)."""
    if trainer.max_time is not None and time.monotonic() - trainer.fit_started_at >= trainer.max_time.total_seconds():
        trainer.should_stop = True


def _advance_past_finished_epoch(trainer: Trainer) -> None:
    """A checkpoint written at the end of an epoch resumes at the start of the next one."""
    state = trainer.loop_state
    if trainer.num_training_batches != float("inf") and 0 <= trainer.num_training_batches <= state.batch_in_epoch:
        state.current_epoch += 1
        state.batch_in_epoch = state.samples_in_epoch = state.resume_sample_offset = 0


def _count_skipped_validation(trainer: Trainer, module: nn.Module) -> None:
    """A checkpoint written in `on_train_batch_end`, before that batch's validation, resumes at the
    next batch without running it; Lightning counts that validation's batches as run all the same."""
    state = trainer.loop_state
    resumed_in_batch_end, state.resumed_in_batch_end = state.resumed_in_batch_end, False
    if not resumed_in_batch_end or state.batch_in_epoch == 0 \
            or not _should_validate(trainer, state.batch_in_epoch - 1, module):
        return
    batches = max(trainer.num_val_batches, default=0)
    if batches != float("inf"):
        state.fit_validation.total += int(batches)
        state.fit_validation.current += int(batches)
        state.fit_validation.is_last_batch = True


def _continue_sample_stream(trainer: Trainer, train_loader: Any) -> None:
    """A mid-epoch checkpoint from another number of processes: resume the epoch's *global*
    sample order at the samples already consumed, instead of at a per-rank batch index (which
    would repeat or skip data). Batch numbering continues so the epoch still ends at the last
    batch of this run's shards. The global batch becomes world_size x batch_size of this run."""
    state = trainer.loop_state
    saved_world, state.world_size = state.world_size, trainer.world_size
    if state.batch_in_epoch == 0 or saved_world in (0, trainer.world_size):
        return  # same world (exact resume by skipping batches) or nothing to continue
    sampler = resumable_sampler(train_loader)
    if sampler is None:
        rank_zero_warn(f"The checkpoint was written by {saved_world} process(es) and this run has "
                       f"{trainer.world_size}; the training sampler cannot start mid-epoch (a custom sampler or "
                       f"iterable data), so epoch {state.current_epoch} resumes at batch {state.batch_in_epoch} of "
                       f"this run's shards and some of its samples may be seen twice or not at all.")
        return
    dataset_size = len(sampler.dataset)
    if state.samples_in_epoch >= dataset_size:
        state.batch_in_epoch = int(trainer.num_training_batches)  # the epoch was complete (a sized sampler)
        return
    sampler.set_start_sample(state.samples_in_epoch)
    left = len(train_loader)
    sampler.set_start_sample(0)
    state.batch_in_epoch = max(0, int(trainer.num_training_batches) - left)
    state.resume_sample_offset = state.samples_in_epoch
    rank_zero_info(f"Resuming epoch {state.current_epoch} written by {saved_world} process(es) on "
                   f"{trainer.world_size}: continuing its sample order after {state.samples_in_epoch} of "
                   f"{dataset_size} samples ({left} batch(es) per rank left); the global batch is now "
                   f"{trainer.world_size} x the per-process batch size.")


def _global_batch_size(trainer: Trainer, loader: Any) -> int:
    """Samples this step consumed on all ranks (the sampler pads, so every rank's batch is alike)."""
    per_rank = trainer.metric_store.current_batch_size or getattr(loader, "batch_size", None) or 1
    return int(per_rank) * trainer.world_size
