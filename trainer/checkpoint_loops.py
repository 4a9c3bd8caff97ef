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

from trainer.loops.batches import members


def lightning_loops(trainer: Any) -> dict[str, Any]:
    """Our position as Lightning's loop counters (only plain ints and bools)."""
    fit_state: dict[str, Any] = {}
    loader_states = stateful_loader_states(trainer.data.loaders.get("train") or [])
    if loader_states:
        fit_state["combined_loader"] = loader_states
    epochs, batches, batches_now = _counters(trainer)
    per_epoch = trainer.num_training_batches
    fit_loop = {
        "state_dict": fit_state,
        # without the batch now ending, as Lightning counts (it adds that one itself on resume)
        "epoch_loop.state_dict": {"_batches_that_stepped": trainer.loop_state.stepped_batches},
        "epoch_loop.batch_progress": {**batches,
                                      "is_last_batch": per_epoch not in (0, float("inf")) and batches_now >= per_epoch},
        "epoch_progress": {"total": epochs, "current": dict(epochs)},  # Lightning: both count all epochs
    }
    steps = trainer.global_step
    steps_now = math.ceil(batches_now / max(1, trainer.accumulate_grad_batches))
    if getattr(trainer.lightning_module, "automatic_optimization", True):
        fit_loop["epoch_loop.automatic_optimization.optim_progress"] = {
            "optimizer": {"step": _two_stage(steps, steps_now), "zero_grad": _three_stage(steps, steps_now)}}
    else:
        fit_loop["epoch_loop.manual_optimization.optim_step_progress"] = _two_stage(steps, steps)
    return {"fit_loop": fit_loop}


def _counters(trainer: Any) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(epoch progress, batch progress, batches of the current epoch) where our loop stands.

    Lightning counts a unit (batch, epoch) ready/started when it begins, processed when its work
    is done and completed once its end hooks have run; a checkpoint written inside those hooks
    holds it as processed but not completed, and Lightning finishes it on resume.
    """
    state = trainer.loop_state
    epoch, done = state.current_epoch, state.batch_in_epoch
    per_epoch = 0 if trainer.num_training_batches == float("inf") else int(trainer.num_training_batches)
    if done == 0:  # between epochs, or after the fit: the last epoch's batches are the current ones
        now = per_epoch if epoch > 0 else 0
        return _four(epoch, epoch, epoch, epoch), {"total": _same(epoch * per_epoch), "current": _same(now)}, now
    ending = int(state.in_batch_end)  # inside on_train_batch_end: the batch is processed, not completed
    total = epoch * per_epoch + done
    batches = {"total": _four(total, total, total, total - ending), "current": _four(done, done, done, done - ending)}
    epoch_processed = per_epoch and done >= per_epoch and not ending and trainer.state.stage == "train"
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


def position_from_lightning(loops: dict[str, Any], checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Our loop position from a checkpoint Lightning wrote (its counters, its `global_step`)."""
    fit_loop = loops.get("fit_loop", {})
    epochs = fit_loop.get("epoch_progress", {}).get("current", {})
    batches = fit_loop.get("epoch_loop.batch_progress", {}).get("current", {})
    started, completed = epochs.get("started", 0), epochs.get("completed", 0)
    in_epoch = started > completed  # written inside an epoch: resume at its next batch
    return {
        "current_epoch": started - 1 if in_epoch else completed,
        "global_step": checkpoint.get("global_step", 0),
        "batch_in_epoch": batches.get("processed", 0) if in_epoch else 0,
        # Lightning counts a stepped batch after its end hooks, and adds it on resume when the
        # checkpoint was written inside an epoch
        "stepped_batches": fit_loop.get("epoch_loop.state_dict", {}).get(
            "_batches_that_stepped", checkpoint.get("global_step", 0)) + int(in_epoch),
    }
