"""The fit loop's side of a preemption notice: stop at the agreed step boundary with one
checkpoint, and resume from it by default (strategies/preemption.py has the agreement).

Where the loop may stop: after an optimizer step once its end hooks, logging and validation are
done (not inside an accumulation window, whose gradients a checkpoint does not hold, and not after
an epoch's last batch, whose epoch-end hooks are still to run), or between two epochs. A checkpoint
there is a position the loop already knows how to resume from exactly: nothing is lost or repeated.

The checkpoint is `<default_root_dir>/preempted.ckpt` (Lightning keeps its SLURM checkpoints in
default_root_dir too): independent of the logger's version folders, so a requeued run finds it.
"""

from __future__ import annotations

import os
from typing import Any

from strategies.rank_zero import rank_zero_info

PREEMPTION_CHECKPOINT = "preempted.ckpt"
MARK = "preemption"  # in the checkpoint's "loops" section of ours: which signal, after which step


def preemption_checkpoint_path(trainer: Any) -> str:
    return os.path.join(str(trainer.default_root_dir), PREEMPTION_CHECKPOINT)


def stop_if_preempted(trainer: Any) -> None:
    """At a step boundary (every rank, the same sequence): when the ranks agreed to stop here,
    write the preemption checkpoint and raise `Preempted` (a SystemExit with code 75)."""
    watch = trainer.preemption_watch
    stepped = trainer.loop_state.stepped_batches
    if watch is None or not watch.due(stepped):
        return
    path = preemption_checkpoint_path(trainer)
    trainer.preemption_mark = {"signal": watch.agreement.signal_name, "stepped_batches": stepped}
    try:
        trainer.save_checkpoint(path)
    finally:
        trainer.preemption_mark = None
    rank_zero_info(f"Preempted by {watch.agreement.signal_name}: every rank stopped after step {trainer.global_step}; "
                   f"checkpoint written to {path}. The next fit in this directory resumes from it.")
    raise watch.stopped(trainer.global_step, path)


def default_resume_path(trainer: Any) -> str | None:
    """A fit without `ckpt_path` resumes from the preemption checkpoint when there is one."""
    path = preemption_checkpoint_path(trainer)
    if not os.path.isfile(path):
        return None
    rank_zero_info(f"Resuming from the preemption checkpoint {path} (pass ckpt_path to start from another); it is "
                   "removed once this fit completes.")
    return path


def discard_if_consumed(trainer: Any) -> None:
    """After a fit that completed from the preemption checkpoint: remove it, so that a later fit in
    the same directory does not resume a finished run."""
    path = preemption_checkpoint_path(trainer)
    if trainer.ckpt_path is not None and os.path.abspath(trainer.ckpt_path) == os.path.abspath(path):
        trainer.strategy.remove_checkpoint(path)
