"""Epochs and batches, when to validate, when to stop. Reads top to bottom:

    on_train_start
    for epoch in epochs:
        sampler.set_epoch(epoch); on_train_epoch_start
        for batch in the epoch's batches:
            on_train_batch_start -> run_training_batch -> on_train_batch_end -> log
            validate if val_check_interval says so; stop if max_steps or should_stop
        epoch metrics; on_train_epoch_end; epoch schedulers
    on_train_end
"""

from __future__ import annotations

from typing import Any

from torch import nn

from trainer.loops.batches import iterate_limited, num_batches
from trainer.loops.evaluation import has_step, run_evaluation
from trainer.loops.training_step import run_training_batch, step_schedulers
from strategies.rank_zero import rank_zero_info, rank_zero_warn
from trainer.seed import restore_rank_rng_states


def run_fit(trainer: Any, module: nn.Module, train_loader: Any, val_loaders: list[Any]) -> None:
    state, callbacks = trainer.loop_state, trainer.callback_list
    trainer.num_training_batches = num_batches(trainer, train_loader, "train")
    trainer.num_val_batches = [num_batches(trainer, loader, "validate") for loader in val_loaders]
    if trainer.num_training_batches == 0:
        raise ValueError("The training dataloader yields no batches (empty dataset, or limit_train_batches=0, "
                         "or drop_last with fewer samples than batch_size per rank).")
    _check_val_interval(trainer)
    _continue_sample_stream(trainer, train_loader)
    _advance_past_finished_epoch(trainer)
    module.train()
    callbacks.call("on_train_start", trainer, module)
    while not _fit_done(trainer):
        _run_epoch(trainer, module, train_loader, val_loaders)
        state.current_epoch += 1
        state.batch_in_epoch = state.samples_in_epoch = 0
    callbacks.call("on_train_end", trainer, module)


def _run_epoch(trainer: Any, module: nn.Module, train_loader: Any, val_loaders: list[Any]) -> None:
    state, callbacks, store = trainer.loop_state, trainer.callback_list, trainer.metric_store
    _set_sampler_epoch(train_loader, state.current_epoch)
    start_sample, state.resume_sample_offset = state.resume_sample_offset, 0
    if start_sample:  # the sampler starts where the other world size stopped: nothing to draw and skip
        _resumable_sampler(train_loader).set_start_sample(start_sample)  # type: ignore[union-attr]
    skip, start_at = (0, state.batch_in_epoch) if start_sample else (state.batch_in_epoch, 0)
    store.reset_stage("train")
    callbacks.call("on_train_epoch_start", trainer, module)
    total = trainer.num_training_batches
    batch_idx, exhausted = -1, True
    for batch_idx, batch in iterate_limited(trainer, train_loader, "train", skip=skip, start_at=start_at,
                                            on_resumed=lambda: _restore_rng(trainer)):
        if callbacks.call("on_train_batch_start", trainer, module, batch, batch_idx) == -1:
            exhausted = False
            break  # Lightning: returning -1 ends the epoch early
        window_end = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or batch_idx + 1 == total
        output = run_training_batch(trainer, module, batch, batch_idx, window_end)
        store.sync_pending()  # the step's sync_dist values, one collective, before callbacks read them
        state.batch_in_epoch = batch_idx + 1
        state.samples_in_epoch += _global_batch_size(trainer, train_loader)
        callbacks.call("on_train_batch_end", trainer, module, output, batch, batch_idx)
        store.sync_pending()  # what on_train_batch_end logged with sync_dist (no-op otherwise)
        _log_step(trainer)
        if _should_validate(trainer, batch_idx, val_loaders, module):
            run_evaluation(trainer, module, val_loaders, "validate")
        if _max_steps_reached(trainer) or trainer.should_stop:
            exhausted = False
            break
    unsized_epoch_ended = exhausted and total < 0 and batch_idx >= 0 and isinstance(trainer.val_check_interval, float)
    if unsized_epoch_ended and _should_validate(trainer, batch_idx, val_loaders, module, epoch_ended=True):
        run_evaluation(trainer, module, val_loaders, "validate")  # an unsized epoch's end is known only now
    store.compute_epoch("train")
    callbacks.call("on_train_epoch_end", trainer, module)
    store.compute_epoch("train")
    trainer.write_logger_metrics()
    step_schedulers(trainer, module, "epoch")


def _log_step(trainer: Any) -> None:
    """Step metrics go to the logger every `log_every_n_steps` optimizer steps."""
    if trainer.global_step % max(trainer.log_every_n_steps, 1) == 0:
        trainer.write_logger_metrics()
    else:
        trainer.metric_store.pop_logger_metrics()


def _should_validate(trainer: Any, batch_idx: int, val_loaders: list[Any], module: nn.Module,
                     epoch_ended: bool = False) -> bool:
    if not val_loaders or not has_step(module, "validate") or not any(trainer.num_val_batches):
        return False
    every_n_epochs = trainer.check_val_every_n_epoch
    if every_n_epochs is not None and (trainer.current_epoch + 1) % every_n_epochs != 0:
        return False
    total = trainer.num_training_batches
    interval = trainer.val_check_interval
    every = max(1, int(total * interval)) if isinstance(interval, float) else int(interval)
    is_last = epoch_ended or batch_idx + 1 == total
    if isinstance(interval, float) and interval == 1.0:
        return is_last or _max_steps_reached(trainer)
    return (batch_idx + 1) % every == 0 or (is_last and isinstance(interval, float))


def _check_val_interval(trainer: Any) -> None:
    """An int interval longer than the epoch would silently never validate (Lightning raises too)."""
    interval, total = trainer.val_check_interval, trainer.num_training_batches
    if total < 0 and isinstance(interval, float) and interval != 1.0:
        raise ValueError(f"val_check_interval={interval} is a fraction of an epoch, but the training data has no "
                         "length (an IterableDataset): use 1.0 (validate when the epoch ends) or an int number of "
                         "batches.")
    if isinstance(interval, int) and trainer.check_val_every_n_epoch is not None and 0 <= total < interval:
        raise ValueError(f"val_check_interval={interval} batches exceeds the {total} training batches per epoch; "
                         "use a smaller int, a float fraction of the epoch, or check_val_every_n_epoch=None.")


def _fit_done(trainer: Any) -> bool:
    if trainer.should_stop or _max_steps_reached(trainer):
        return True
    max_epochs = trainer.max_epochs
    return max_epochs is not None and max_epochs >= 0 and trainer.current_epoch >= max_epochs


def _max_steps_reached(trainer: Any) -> bool:
    return trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps


def _advance_past_finished_epoch(trainer: Any) -> None:
    """A checkpoint written at the end of an epoch resumes at the start of the next one."""
    state = trainer.loop_state
    if 0 <= trainer.num_training_batches <= state.batch_in_epoch:  # -1: unsized, length unknown
        state.current_epoch += 1
        state.batch_in_epoch = state.samples_in_epoch = state.resume_sample_offset = 0


def _continue_sample_stream(trainer: Any, train_loader: Any) -> None:
    """A mid-epoch checkpoint from another number of processes: resume the epoch's *global*
    sample order at the samples already consumed, instead of at a per-rank batch index (which
    would repeat or skip data). Batch numbering continues so the epoch still ends at the last
    batch of this run's shards. The global batch becomes world_size x batch_size of this run."""
    state = trainer.loop_state
    saved_world, state.world_size = state.world_size, trainer.world_size
    if state.batch_in_epoch == 0 or saved_world in (0, trainer.world_size):
        return  # same world (exact resume by skipping batches) or nothing to continue
    sampler = _resumable_sampler(train_loader)
    if sampler is None:
        rank_zero_warn(f"The checkpoint was written by {saved_world} process(es) and this run has "
                       f"{trainer.world_size}; the training sampler cannot start mid-epoch (a custom sampler or "
                       f"iterable data), so epoch {state.current_epoch} resumes at batch {state.batch_in_epoch} of "
                       f"this run's shards and some of its samples may be seen twice or not at all.")
        return
    dataset_size = len(sampler.dataset)
    if state.samples_in_epoch >= dataset_size:
        state.batch_in_epoch = trainer.num_training_batches  # the epoch was complete
        return
    sampler.set_start_sample(state.samples_in_epoch)
    left = len(train_loader)
    sampler.set_start_sample(0)
    state.batch_in_epoch = max(0, trainer.num_training_batches - left)
    state.resume_sample_offset = state.samples_in_epoch
    rank_zero_info(f"Resuming epoch {state.current_epoch} written by {saved_world} process(es) on "
                   f"{trainer.world_size}: continuing its sample order after {state.samples_in_epoch} of "
                   f"{dataset_size} samples ({left} batch(es) per rank left); the global batch is now "
                   f"{trainer.world_size} x the per-process batch size.")


def _resumable_sampler(loader: Any) -> Any:
    sampler = getattr(loader, "sampler", None)
    return sampler if callable(getattr(sampler, "set_start_sample", None)) else None


def _global_batch_size(trainer: Any, loader: Any) -> int:
    """Samples this step consumed on all ranks (the sampler pads, so every rank's batch is alike)."""
    per_rank = trainer.metric_store.current_batch_size or getattr(loader, "batch_size", None) or 1
    return int(per_rank) * trainer.world_size


def _restore_rng(trainer: Any) -> None:
    """Put back every rank's RNG exactly where the checkpoint was taken: after the resumed epoch's
    iterator was built (building one draws a seed) and its finished batches were drawn."""
    states, trainer.loop_state.rng_to_restore = trainer.loop_state.rng_to_restore, None
    if states is not None:
        restore_rank_rng_states(states, trainer.global_rank, trainer.strategy.root_device.type)


def _set_sampler_epoch(loader: Any, epoch: int) -> None:
    """DistributedSampler shuffles by epoch: without this every epoch repeats one order."""
    for source in (getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
        for candidate in (source, getattr(source, "sampler", None)):
            if callable(getattr(candidate, "set_epoch", None)):
                candidate.set_epoch(epoch)
