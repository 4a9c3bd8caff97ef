"""Where a resumed fit picks up inside its first epoch, taken once from what the checkpoint restored.

`restore_training_state` (trainer/checkpointing.py) loads the checkpoint's counters into the Trainer's
progress and returns the rest (loader and RNG states), which `ResumePoint.restored` takes; a fit without a checkpoint
starts from an empty one, since a fit may also go on from where an earlier fit stopped mid-epoch. The
fit loop settles it once the training loader is known and its first epoch gets a ready source of
batches from it. Three ways to reach the progress' batch, cheapest first:

* a stateful dataloader (`state_dict`/`load_state_dict`) is put back and continues by itself;
* a checkpoint written by another number of processes: the sampler starts at the global sample the
  interrupted run had reached (nothing drawn twice), and batches are numbered from the checkpoint's;
* otherwise the epoch's finished batches are drawn again and discarded (exact with a seeded sampler).

Every rank's RNG is put back at the exact point the checkpoint was taken: after the epoch's iterator
was built (building one draws a seed) and its finished batches were drawn.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strategies.rank_zero import rank_zero_info, rank_zero_warn
from trainer.checkpoint_loops import restore_loader_states
from trainer.loops.batches import iterate_limited
from trainer.seed import restore_rank_rng_states
from trainer.stage import Stage

if TYPE_CHECKING:
    from trainer.state import FitProgress


@dataclass
class ResumePoint:
    """What a checkpoint restored beyond the progress counters, until the fit's first epoch uses it."""

    loader_states: list[dict[str, Any]] = field(default_factory=list)
    rng_states: dict[str, Any] | None = None
    in_batch_end: bool = False  # the checkpoint was written in on_train_batch_end
    start_sample: int = 0  # another world size: the global sample the sampler starts at (see `continue_stream`)

    @classmethod
    def restored(cls, progress: FitProgress, loader_states: list[dict[str, Any]],
                 rng_states: dict[str, Any] | None) -> ResumePoint:
        """The point a checkpoint just loaded into `progress` describes; its in-batch-end mark moves here
        (the new fit is not inside any batch's end hooks)."""
        point = cls(loader_states, rng_states, progress.in_batch_end)
        progress.in_batch_end = False
        return point

    @staticmethod
    def skip_finished_epoch(parts: Stage) -> None:
        """A checkpoint written at the end of an epoch resumes at the start of the next one (once the
        training loader's length is known; before the fit decides whether anything is left to train)."""
        progress, per_epoch = parts.progress, parts.data.counts.train
        if per_epoch != float("inf") and 0 <= per_epoch <= progress.batch_in_epoch:
            progress.current_epoch += 1
            progress.batch_in_epoch = progress.samples_in_epoch = 0

    def continue_sample_stream(self, parts: Stage, train_loader: Any) -> None:
        """Right before training starts: where in the data a checkpoint from another world size goes on."""
        self.start_sample = continue_stream(parts, train_loader)

    def pending(self, progress: FitProgress) -> bool:
        """Whether the first epoch must open through `open`: it picks up inside an epoch, or has a loader's or
        the RNG's state to put back."""
        return bool(progress.batch_in_epoch or self.start_sample or self.loader_states) or self.rng_states is not None

    def open(self, parts: Stage, loader: Any) -> Iterator[tuple[int, Any]]:
        """Position `loader` at the progress' batch and return the resumed epoch's `(batch_idx, batch)` pairs
        (lazily: the epoch-start hooks run in between, as in the interrupted run)."""
        done = parts.progress.batch_in_epoch
        if self.start_sample:  # the sampler starts where the other world size stopped: nothing to skip
            resumable_sampler(loader).set_start_sample(self.start_sample)
        positioned = restore_loader_states([loader], self.loader_states) or bool(self.start_sample)
        skip, start_at = (0, done) if positioned else (done, 0)  # positioned loaders resume by themselves
        if skip:
            rank_zero_warn(f"Resuming inside epoch {parts.progress.current_epoch}: the training dataloader "
                           "cannot restore its position (it has no state_dict/load_state_dict), so its first "
                           f"{skip} batch(es) are drawn again and discarded. That reproduces the interrupted run only "
                           "if it yields the same batches in the same order (a seeded sampler does; a stream may "
                           "not). Resume from an end-of-epoch checkpoint, or give the dataloader "
                           "state_dict()/load_state_dict().")
        return iterate_limited(parts, loader, "train", skip=skip, start_at=start_at,
                               on_resumed=lambda: self._restore_rng(parts))

    def _restore_rng(self, parts: Stage) -> None:
        if self.rng_states is not None:
            restore_rank_rng_states(self.rng_states, parts.strategy.global_rank, parts.strategy.root_device.type)


def continue_stream(parts: Stage, train_loader: Any) -> int:
    """A mid-epoch checkpoint from another number of processes: resume the epoch's *global* sample
    order at the samples already consumed, instead of at a per-rank batch index (which would repeat
    or skip data); returns that sample (0: resume by batch index, or nothing to resume). Batch
    numbering continues so the epoch still ends at the last batch of this run's shards. The global
    batch becomes world_size x batch_size of this run."""
    progress, world_size, per_epoch = parts.progress, parts.strategy.world_size, parts.data.counts.train
    saved_world, progress.world_size = progress.world_size, world_size
    if progress.batch_in_epoch == 0 or saved_world in (0, world_size):
        return 0  # same world (exact resume by skipping batches) or nothing to continue
    sampler = resumable_sampler(train_loader)
    if sampler is None:
        rank_zero_warn(f"The checkpoint was written by {saved_world} process(es) and this run has "
                       f"{world_size}; the training sampler cannot start mid-epoch (a custom sampler or "
                       f"iterable data), so epoch {progress.current_epoch} resumes at batch {progress.batch_in_epoch} "
                       f"of this run's shards and some of its samples may be seen twice or not at all.")
        return 0
    dataset_size = len(sampler.dataset)
    if progress.samples_in_epoch >= dataset_size:
        progress.batch_in_epoch = int(per_epoch)  # the epoch was complete (a sized sampler)
        return 0
    sampler.set_start_sample(progress.samples_in_epoch)
    left = len(train_loader)
    sampler.set_start_sample(0)
    progress.batch_in_epoch = max(0, int(per_epoch) - left)
    rank_zero_info(f"Resuming epoch {progress.current_epoch} written by {saved_world} process(es) on "
                   f"{world_size}: continuing its sample order after {progress.samples_in_epoch} of "
                   f"{dataset_size} samples ({left} batch(es) per rank left); the global batch is now "
                   f"{world_size} x the per-process batch size.")
    return progress.samples_in_epoch


def resumable_sampler(loader: Any) -> Any:
    """The loader's sampler when it can start mid-epoch (ours, strategies/sampler.py), else None."""
    sampler = getattr(loader, "sampler", None)
    return sampler if callable(getattr(sampler, "set_start_sample", None)) else None
