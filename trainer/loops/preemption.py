"""The fit loop's side of a preemption notice: stop at the agreed step boundary with one
checkpoint, and resume from it by default (strategies/stop_agreement.py has the agreement).

Where the loop may stop: after an optimizer step once its end hooks, logging and validation are
done (not inside an accumulation window, whose gradients a checkpoint does not hold, and not after
an epoch's last batch, whose epoch-end hooks are still to run), or between two epochs. A checkpoint
there is a position the loop already knows how to resume from exactly: nothing is lost or repeated.

The checkpoint is `<default_root_dir>/preempted.ckpt` (Lightning keeps its SLURM checkpoints in
default_root_dir too): independent of the logger's version folders, so a requeued run finds it. It
names the run it belongs to (the module's class and hyperparameters): a fit of another model, or
of the same model with other hyperparameters (a sweep sharing the directory), does not resume it
(trainer/checkpoint_choice.py chooses it).
"""

from __future__ import annotations

from strategies.rank_zero import rank_zero_info
from trainer.checkpoint_choice import preemption_checkpoint_path
from trainer.stage import Stage


def stop_if_preempted(stage: Stage) -> None:
    """At a step boundary (every rank, the same sequence): when the ranks agreed to stop here,
    write the preemption checkpoint and raise `Preempted` (a SystemExit with code 75). A checkpoint
    that cannot be written still ends the job the same way (requeued), with the error chained."""
    watch = stage.fit_run.preemption_watch
    stepped = stage.progress.stepped_batches
    if watch is None or not watch.due(stepped):
        return
    path = preemption_checkpoint_path(stage.trainer)
    stage.fit_run.preemption_mark = {"signal": watch.signal_name, "stepped_batches": stepped}
    try:
        stage.trainer.save_checkpoint(path)
    except Exception as error:  # a full disk: the previous checkpoints stay the resume point
        raise watch.stopped(stage.progress.global_step, None) from error
    finally:
        stage.fit_run.preemption_mark = None
    rank_zero_info(f"Preempted by {watch.signal_name}: every rank stopped after step {stage.progress.global_step}; "
                   f"checkpoint written to {path}. The next fit in this directory resumes from it.")
    raise watch.stopped(stage.progress.global_step, path)
