"""Loop progress in one small, picklable dataclass (what a checkpoint must restore)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EvalCount:
    """Batches an evaluation loop has run, as Lightning's loop counters keep them: `total` over
    several runs, `current` in the latest one, whether its last batch came, and `ending` while a
    batch's end hooks run (a checkpoint written there holds that batch as not yet completed)."""

    total: int = 0
    current: int = 0
    is_last_batch: bool = False
    ending: bool = False

    def start_run(self) -> None:
        self.current, self.is_last_batch = 0, False

    def batch_done(self, is_last_batch: bool) -> None:
        """A batch's step ran; its end hooks are next (call `end_hooks_done` after them)."""
        self.total += 1
        self.current += 1
        self.is_last_batch, self.ending = is_last_batch, True

    def end_hooks_done(self) -> None:
        self.ending = False


@dataclass
class LoopState:
    """Where the fit loop is. `batch_in_epoch` is the index of the next training batch to
    run in `current_epoch`, so a mid-epoch checkpoint resumes at the right batch."""

    current_epoch: int = 0
    global_step: int = 0
    batch_in_epoch: int = 0
    should_stop: bool = False
    # Samples of `current_epoch` consumed by all ranks together, in the sampler's global order,
    # and the number of processes that consumed them: a resume on another number of processes
    # continues the same sample stream from there (see fit_loop._continue_sample_stream).
    samples_in_epoch: int = 0
    world_size: int = 0  # 0: unknown (an older checkpoint)
    resume_sample_offset: int = 0  # set for the resumed epoch only; never saved
    # Every rank's RNG states from a checkpoint, restored by the fit loop at the exact point of
    # the interrupted run (after the resumed epoch's iterator is rebuilt), not when loading.
    rng_to_restore: dict[str, Any] | None = None
    # Positions of stateful training dataloaders from a checkpoint, put back before the resumed
    # epoch's iterator is built (those loaders then resume themselves: nothing is skipped).
    loader_states_to_restore: list[dict[str, Any]] = field(default_factory=list)
    is_last_batch: bool = False  # the batch being run is its epoch's last (Lightning's trainer.is_last_batch)
    # Batches that ended with an optimizer step (Lightning's `_batches_that_stepped`): the step
    # metrics are logged at; in manual optimization one per batch, however many optimizers stepped.
    stepped_batches: int = 0
    # The batch now ending stepped the optimizer but is counted in `stepped_batches` only after its
    # end hooks and validation; a checkpoint written there counts it (the resume starts after it).
    step_in_flight: bool = False
    # on_train_batch_end is running: checkpoints written there count the batch unfinished (and record
    # it: a resume from there counts that batch's skipped validation, see fit_loop._count_skipped_validation)
    in_batch_end: bool = False
    resumed_in_batch_end: bool = False  # the checkpoint resumed from was written there (never saved as such)
    train_loader_epoch: int = 0  # the epoch the training loader was last requested in (never saved)
    # The epoch fit last requested the validation loaders in, as reload_dataloaders_every_n_epochs counts
    # (None: not yet; a sanity check in an epoch without validation does not count); never saved
    val_loader_epoch: int | None = None
    validated_in_fit: bool = False  # a validation (not the sanity check) ran in this fit (never saved)
    # The fit resumed inside an epoch and that epoch has not ended yet (Lightning's fit_loop.restarting; never saved)
    restarting: bool = False
    # Learning-rate scheduler steps taken by the loop, in the whole fit and in the current epoch
    # (counted until the next epoch starts, so an epoch-end checkpoint holds that epoch's).
    scheduler_steps: int = 0
    scheduler_steps_in_epoch: int = 0
    # Batches of the validation runs inside fit (total: this training epoch's; current: the latest run's).
    fit_validation: EvalCount = field(default_factory=EvalCount)
    # Batches of validate()/test()/predict() on this Trainer (total: every call; current: the latest).
    # Not saved in checkpoints: a fit resumed from one starts them afresh, as Lightning does.
    stage_counts: dict[str, EvalCount] = field(default_factory=dict)

    def eval_count(self, stage: str, in_fit: bool) -> EvalCount:
        """The batch counter of an evaluation loop: validation inside fit, or a validate/test/predict call."""
        return self.fit_validation if in_fit else self.stage_counts.setdefault(stage, EvalCount())

    def state_dict(self) -> dict[str, Any]:
        transient = ("should_stop", "rng_to_restore", "loader_states_to_restore", "resume_sample_offset",
                     "is_last_batch", "train_loader_epoch", "val_loader_epoch", "validated_in_fit", "step_in_flight",
                     "resumed_in_batch_end", "restarting")
        state = {k: v for k, v in asdict(self).items() if k not in transient}
        state["stepped_batches"] += int(self.step_in_flight)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("current_epoch", "global_step", "batch_in_epoch", "samples_in_epoch",
                    "world_size", "stepped_batches", "scheduler_steps", "scheduler_steps_in_epoch"):
            if key in state:
                setattr(self, key, state[key])
        if "stepped_batches" not in state:  # a checkpoint from before the counter: one step per stepped batch
            self.stepped_batches = self.global_step
        self.resumed_in_batch_end = bool(state.get("in_batch_end", False))
        if "fit_validation" in state:
            self.fit_validation = EvalCount(**state["fit_validation"])
        for stage, count in state.get("stage_counts", {}).items():
            self.stage_counts[stage] = EvalCount(**count)


class _Name(str):
    """A plain string that also answers `.value`, as Lightning's string enums do (`trainer.state.fn.value`)."""

    @property
    def value(self) -> str:
        return str(self)


def _named(value: str | None) -> _Name | None:
    return None if value is None else _Name(value)


@dataclass
class TrainerStatus:
    """What the trainer is doing right now (Lightning's `trainer.state`): `status` is one of
    "initializing", "running", "finished", "interrupted"; `fn` the entry point ("fit", "validate",
    "test", "predict"); `stage` the loop running ("train", "sanity_check", "validate", "test",
    "predict"). Plain strings compare equal to Lightning's string enums."""

    fn: str | None = None
    stage: str | None = None
    status: str = "initializing"

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, _named(value) if isinstance(value, str) else value)

    @property
    def finished(self) -> bool:
        """The latest fit/validate/test/predict ran to its end."""
        return self.status == "finished"

    @property
    def stopped(self) -> bool:
        """The latest entry point is over, finished or interrupted."""
        return self.status in ("finished", "interrupted")

    def __eq__(self, other: object) -> bool:
        """Equal to any state with the same status, fn and stage: ours, or Lightning's `TrainerState`
        (its string enums compare equal to our plain strings)."""
        fields = ("status", "fn", "stage")
        if not all(hasattr(other, name) for name in fields):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in fields)

    __hash__ = None  # type: ignore[assignment]  # mutable: as a dataclass with eq

