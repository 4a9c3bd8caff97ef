"""The Trainer's state, by lifetime: what a checkpoint saves (`FitProgress`), what one fit uses and
drops (`FitRun`), and what the Trainer is doing now (`TrainerStatus`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from trainer.nonfinite import NonFiniteWatch


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
class FitProgress:
    """How far training has come: exactly what a checkpoint saves and a resume restores (the
    `state_dict` is these fields). `batch_in_epoch` is the index of the next training batch of
    `current_epoch`, so a mid-epoch checkpoint resumes at the right batch."""

    current_epoch: int = 0
    global_step: int = 0
    batch_in_epoch: int = 0
    # Samples of `current_epoch` consumed by all ranks together, in the sampler's global order,
    # and the number of processes that consumed them: a resume on another number of processes
    # continues the same sample stream from there (see ResumePoint in trainer/loops/resume.py).
    samples_in_epoch: int = 0
    world_size: int = 0  # 0: unknown (an older checkpoint)
    # Batches that ended with an optimizer step (Lightning's `_batches_that_stepped`): the step
    # metrics are logged at; in manual optimization one per batch, however many optimizers stepped.
    stepped_batches: int = 0
    # The batch now ending stepped the optimizer but is counted in `stepped_batches` only after its
    # end hooks and validation; a checkpoint written there counts it (the resume starts after it).
    step_in_flight: bool = False
    # on_train_batch_end is running: a checkpoint written there holds the batch unfinished and says so
    # (a resume from there counts that batch's skipped validation: fit_loop._count_skipped_validation)
    in_batch_end: bool = False
    # Learning-rate scheduler steps taken by the loop, in the whole fit and in the current epoch
    # (counted until the next epoch starts, so an epoch-end checkpoint holds that epoch's).
    scheduler_steps: int = 0
    scheduler_steps_in_epoch: int = 0
    # Batches of the validation runs inside fit (total: this training epoch's; current: the latest run's).
    fit_validation: EvalCount = field(default_factory=EvalCount)
    # Batches of validate()/test()/predict() on this Trainer (total: every call; current: the latest).
    stage_counts: dict[str, EvalCount] = field(default_factory=dict)

    def eval_count(self, stage: str, in_fit: bool) -> EvalCount:
        """The batch counter of an evaluation loop: validation inside fit, or a validate/test/predict call."""
        return self.fit_validation if in_fit else self.stage_counts.setdefault(stage, EvalCount())

    def state_dict(self) -> dict[str, Any]:
        state = asdict(self)
        state["stepped_batches"] += int(state.pop("step_in_flight"))  # the step in flight has happened
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Every field the checkpoint holds; an older checkpoint's missing ones keep their defaults."""
        for name in (item.name for item in fields(self)):
            if name in state:
                setattr(self, name, _loaded(name, state[name]))
        if "stepped_batches" not in state:  # a checkpoint from before the counter: one step per stepped batch
            self.stepped_batches = self.global_step


def _loaded(name: str, value: Any) -> Any:
    """A saved field as the dataclass holds it (the evaluation counters are saved as plain dicts)."""
    if name == "fit_validation":
        return EvalCount(**value)
    if name == "stage_counts":
        return {stage: EvalCount(**count) for stage, count in value.items()}
    return value


@dataclass
class FitRun:
    """One fit's transient flags: created as `fit()` starts, before any hook can ask the fit to stop,
    and never saved; it stays on the Trainer afterwards so the caller can read how the fit ended."""

    should_stop: bool = False  # Lightning's `trainer.should_stop` (reset by every fit, as there)
    is_last_batch: bool = False  # the batch being run is its epoch's last (Lightning's; a new fit starts with the last one's)
    started_at: float = 0.0  # time.monotonic() when training started (max_time counts from there)
    # The fit resumed inside an epoch and that epoch has not ended yet (Lightning's fit_loop.restarting)
    restarting: bool = False
    validated_in_fit: bool = False  # a validation (not the sanity check) ran in this fit
    train_loader_epoch: int = 0  # the epoch the training loader was last requested in
    # The epoch fit last requested the validation loaders in, as reload_dataloaders_every_n_epochs counts
    # (None: not yet; a sanity check in an epoch without validation does not count)
    val_loader_epoch: int | None = None
    nonfinite_watch: NonFiniteWatch = field(default_factory=NonFiniteWatch)
    preemption_watch: Any = None  # the fit's PreemptionWatch (trainer/loops/preemption.py); it holds a store
    preemption_mark: dict[str, Any] | None = None  # while the preemption checkpoint is built
    resumed_after_preemption: bool = False  # this fit resumed a preempted run: its checkpoint goes at the end

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "preemption_watch": None}  # a watch holds a store: it stays in its process


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

