"""The checkpoint's `loops` entry in Lightning's layout, and our loop position read back from it.

Lightning keeps its loop position as progress counters (`ready`/`started`/`processed`/
`completed`, each as a running `total` and for the `current` epoch) under `checkpoint["loops"]`,
and its Trainer resumes from them. We write the same counters, derived from our own position,
so Lightning's Trainer can resume from our checkpoints; we read them back when a checkpoint
comes from Lightning. Our own exact-resume state (every rank's RNG, metric state, the sample
offset) lives under a key of its own (see checkpointing.py), because it holds tensors a
Lightning user does not expect among loop counters.

Stateful dataloaders (those with `state_dict`/`load_state_dict`, e.g. torchdata's
StatefulDataLoader) save their position as Lightning does, under
`loops["fit_loop"]["state_dict"]["combined_loader"]`, and resume themselves.
"""

from __future__ import annotations

import math
from typing import Any

from trainer.batch_counts import members
from trainer.stage import Stage
from trainer.state import EvalCount


def lightning_loops(parts: Stage) -> dict[str, Any]:
    """Our position as Lightning's loop counters (only plain ints and bools): every key Lightning's
    Trainer writes, the fit loop's and its evaluation loops'."""
    state = parts.progress
    fit_state: dict[str, Any] = {}
    loader_states = stateful_loader_states(parts.data.loaders.get("train") or [])
    if loader_states:
        fit_state["combined_loader"] = loader_states
    epochs, batches, batches_now = _counters(parts)
    per_epoch = parts.data.counts.train
    steps = parts.progress.global_step
    automatic = getattr(parts.module, "automatic_optimization", True)
    steps_now, zero_grads_now = _window_counts(parts, batches_now) if automatic else (0, 0)
    automatic_steps, manual_steps = (steps, 0) if automatic else (0, steps)
    fit_loop = {
        "state_dict": fit_state,
        "epoch_progress": {"total": epochs, "current": dict(epochs)},  # Lightning: both count all epochs
        # without the batch now ending, as Lightning counts (it adds that one itself on resume)
        "epoch_loop.state_dict": {"_batches_that_stepped": state.stepped_batches},
        "epoch_loop.batch_progress": {**batches,
                                      "is_last_batch": per_epoch not in (0, float("inf")) and batches_now >= per_epoch},
        "epoch_loop.scheduler_progress": _two_stage(state.scheduler_steps, state.scheduler_steps_in_epoch),
        # Lightning keeps both optimization loops' counters; the one not in use stays at zero
        "epoch_loop.manual_optimization.state_dict": {},
        "epoch_loop.manual_optimization.optim_step_progress": _two_stage(manual_steps, manual_steps),
        "epoch_loop.automatic_optimization.state_dict": {},
        "epoch_loop.automatic_optimization.optim_progress": {"optimizer": {
            "step": _two_stage(automatic_steps, steps_now),
            # one zero_grad per accumulation window, at its first batch; the open window has had its own
            "zero_grad": _three_stage(automatic_steps - steps_now + zero_grads_now, zero_grads_now)}},
        "epoch_loop.val_loop.state_dict": {},
        "epoch_loop.val_loop.batch_progress": _eval_progress(state.fit_validation),
    }
    loops: dict[str, Any] = {"fit_loop": fit_loop}
    for stage, name in (("validate", "validate_loop"), ("test", "test_loop"), ("predict", "predict_loop")):
        progress = _eval_progress(state.eval_count(stage, in_fit=False))
        if stage == "predict":  # Lightning's prediction loop does not keep is_last_batch
            progress.pop("is_last_batch")
        loops[name] = {"state_dict": {}, "batch_progress": progress}
    return loops


def _window_counts(parts: Stage, batches_now: int) -> tuple[int, int]:
    """(optimizer steps, zero_grads) of the current epoch after `batches_now` batches: a step ends
    each accumulation window (the epoch's last batch ends the last one), a zero_grad opens it."""
    every = max(1, parts.live.accumulate_grad_batches)
    closes_epoch = batches_now == parts.data.counts.train and batches_now % every != 0
    return batches_now // every + int(closes_epoch), math.ceil(batches_now / every)


def _eval_progress(count: EvalCount) -> dict[str, Any]:
    ending = int(count.ending)
    return {"total": _four(count.total, count.total, count.total, count.total - ending),
            "current": _four(count.current, count.current, count.current, count.current - ending),
            "is_last_batch": count.is_last_batch}


def _counters(parts: Stage) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(epoch progress, batch progress, batches of the current epoch) where our loop stands.

    Lightning counts a unit (batch, epoch) ready/started when it begins, processed when its work
    is done and completed once its end hooks have run; a checkpoint written inside those hooks
    holds it as processed but not completed, and Lightning finishes it on resume.
    """
    state = parts.progress
    epoch, done = state.current_epoch, state.batch_in_epoch
    per_epoch = 0 if parts.data.counts.train == float("inf") else int(parts.data.counts.train)
    if done == 0:  # between epochs, or after the fit: the last epoch's batches are the current ones
        now = per_epoch if epoch > 0 else 0
        return _four(epoch, epoch, epoch, epoch), {"total": _same(epoch * per_epoch), "current": _same(now)}, now
    ending = int(state.in_batch_end)  # inside on_train_batch_end: the batch is processed, not completed
    total = epoch * per_epoch + done
    batches = {"total": _four(total, total, total, total - ending), "current": _four(done, done, done, done - ending)}
    epoch_processed = per_epoch and done >= per_epoch and not ending and parts.status.stage == "train"
    epochs = _four(epoch + 1, epoch + 1, epoch + int(bool(epoch_processed)), epoch)  # in on_train_epoch_end?
    return epochs, batches, done


def _four(ready: int, started: int, processed: int, completed: int) -> dict[str, int]:
    return {"ready": ready, "started": started, "processed": processed, "completed": completed}


def _same(value: int) -> dict[str, int]:
    return {"ready": value, "started": value, "processed": value, "completed": value}


def _two_stage(total: int, current: int) -> dict[str, dict[str, int]]:
    return {"total": {"ready": total, "completed": total}, "current": {"ready": current, "completed": current}}


def _three_stage(total: int, current: int) -> dict[str, dict[str, int]]:
    return {"total": {"ready": total, "completed": total, "started": total},
            "current": {"ready": current, "completed": current, "started": current}}


def stateful_loader_states(loaders: list[Any]) -> list[dict[str, Any]]:
    """`state_dict()` of every training loader that can restore itself, in order."""
    return [member.state_dict() for loader in loaders for member in members(loader) if _is_stateful(member)]


def restore_loader_states(loaders: list[Any], states: list[dict[str, Any]]) -> bool:
    """Put saved positions back into the stateful training loaders; True when some were restored
    (they then resume by themselves, and the fit loop must not skip batches)."""
    if not states:
        return False
    stateful = [member for loader in loaders for member in members(loader) if _is_stateful(member)]
    if len(stateful) != len(states):
        raise ValueError(f"the checkpoint holds the state of {len(states)} stateful training dataloader(s), but this "
                         f"fit has {len(stateful)}: use the same training dataloaders as the run that saved it.")
    for member, state in zip(stateful, states):
        member.load_state_dict(state)
    return True


def _is_stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def saved_loader_states(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The stateful training loaders' positions a checkpoint holds (Lightning's place for them)."""
    loops = checkpoint.get("loops")
    fit_state = loops.get("fit_loop", {}).get("state_dict", {}) if isinstance(loops, dict) else {}
    return list(fit_state.get("combined_loader", []))


def position_from_lightning(loops: dict[str, Any], checkpoint: dict[str, Any],
                            accumulate_grad_batches: int = 1) -> dict[str, Any]:
    """Our loop position from a checkpoint Lightning wrote (its counters, its `global_step`)."""
    fit_loop = loops.get("fit_loop", {})
    epochs = fit_loop.get("epoch_progress", {}).get("current", {})
    batch_progress = fit_loop.get("epoch_loop.batch_progress", {})
    batches = batch_progress.get("current", {})
    started, completed = epochs.get("started", 0), epochs.get("completed", 0)
    in_epoch = started > completed  # written inside an epoch: resume at its next batch
    schedulers = fit_loop.get("epoch_loop.scheduler_progress", {})
    validation = fit_loop.get("epoch_loop.val_loop.batch_progress", {})
    batch_total = batch_progress.get("total", {})
    return {
        "current_epoch": started - 1 if in_epoch else completed,
        "global_step": checkpoint.get("global_step", 0),
        "batch_in_epoch": batches.get("processed", 0) if in_epoch else 0,
        "in_batch_end": in_epoch and batch_total.get("completed", 0) == batch_total.get("processed", 0) - 1,
        "stepped_batches": fit_loop.get("epoch_loop.state_dict", {}).get(
            "_batches_that_stepped", checkpoint.get("global_step", 0)) + int(
            _stepped_unfinished_batch(epochs, batch_progress, accumulate_grad_batches)),
        "scheduler_steps": schedulers.get("total", {}).get("completed", 0),
        "scheduler_steps_in_epoch": schedulers.get("current", {}).get("completed", 0),
        "fit_validation": {"total": validation.get("total", {}).get("completed", 0),
                           "current": validation.get("current", {}).get("completed", 0),
                           "is_last_batch": bool(validation.get("is_last_batch", False))},
    }


def _stepped_unfinished_batch(epochs: dict[str, int], batch_progress: dict[str, Any],
                              accumulate_grad_batches: int) -> bool:
    """Lightning counts a stepped batch once the batch's end hooks and validation are over, so a
    checkpoint written before that (in `on_train_batch_end`, or in the validation that follows)
    lacks it, and Lightning adds it on resume; not so for one written once the epoch's batches
    were all done (`on_train_epoch_end`, fit end) or after a batch that only accumulated."""
    processed = epochs.get("processed", 0)
    if epochs.get("ready", 0) == processed and epochs.get("started", 0) == processed:
        return False
    ready = batch_progress.get("current", {}).get("ready", 0)
    window_ends = ready % max(1, accumulate_grad_batches) == 0
    return ready > 0 and (window_ends or bool(batch_progress.get("is_last_batch", False)))
