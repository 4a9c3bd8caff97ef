"""Where a resumed fit picks up inside its first epoch, taken once from what the checkpoint restored.

`restore_training_state` (trainer/checkpointing.py) leaves the checkpoint's position pending in the
loop state; the fit loop takes it here before its first epoch and hands that epoch a ready source of
batches. Three ways to reach the checkpoint's batch, cheapest first:

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

from strategies.rank_zero import rank_zero_warn
from trainer.checkpoint_loops import restore_loader_states
from trainer.loops.batches import iterate_limited
from trainer.seed import restore_rank_rng_states

if TYPE_CHECKING:
    from trainer.state import LoopState
    from trainer.trainer import Trainer


@dataclass
class ResumePoint:
    batch_in_epoch: int  # the next batch of the resumed epoch
    start_sample: int = 0  # another world size: the global sample the sampler starts at
    loader_states: list[dict[str, Any]] = field(default_factory=list)
    rng_states: dict[str, Any] | None = None

    @classmethod
    def take(cls, state: LoopState) -> ResumePoint | None:
        """The pending position, cleared from `state`; None when the fit starts afresh."""
        point = cls(state.batch_in_epoch, state.resume_sample_offset, state.loader_states_to_restore,
                    state.rng_to_restore)
        state.resume_sample_offset, state.loader_states_to_restore, state.rng_to_restore = 0, [], None
        fresh = not (point.batch_in_epoch or point.start_sample or point.loader_states) and point.rng_states is None
        return None if fresh else point

    def open(self, trainer: Trainer, loader: Any) -> Iterator[tuple[int, Any]]:
        """Position `loader` now and return the resumed epoch's `(batch_idx, batch)` pairs (lazily: the
        epoch-start hooks run in between, as in the interrupted run)."""
        skip, start_at = self.batch_in_epoch, 0
        if self.start_sample:  # the sampler starts where the other world size stopped: nothing to skip
            resumable_sampler(loader).set_start_sample(self.start_sample)
            skip, start_at = 0, self.batch_in_epoch
        if restore_loader_states([loader], self.loader_states):  # they resume by themselves
            skip, start_at = 0, self.batch_in_epoch
        if skip:
            rank_zero_warn(f"Resuming inside epoch {trainer.current_epoch}: the training dataloader cannot restore its "
                           f"position (it has no state_dict/load_state_dict), so its first {skip} batch(es) are drawn "
                           "again and discarded. That reproduces the interrupted run only if it yields the same "
                           "batches in the same order (a seeded sampler does; a stream may not). Resume from an "
                           "end-of-epoch checkpoint, or give the dataloader state_dict()/load_state_dict().")
        return iterate_limited(trainer, loader, "train", skip=skip, start_at=start_at,
                               on_resumed=lambda: self._restore_rng(trainer))

    def _restore_rng(self, trainer: Trainer) -> None:
        if self.rng_states is not None:
            restore_rank_rng_states(self.rng_states, trainer.global_rank, trainer.strategy.root_device.type)


def resumable_sampler(loader: Any) -> Any:
    """The loader's sampler when it can start mid-epoch (ours, strategies/sampler.py), else None."""
    sampler = getattr(loader, "sampler", None)
    return sampler if callable(getattr(sampler, "set_start_sample", None)) else None
