"""Loop progress in one small, picklable dataclass (what a checkpoint must restore)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class LoopState:
    """Where the fit loop is. `batch_in_epoch` is the index of the next training batch to
    run in `current_epoch`, so a mid-epoch checkpoint resumes at the right batch."""

    current_epoch: int = 0
    global_step: int = 0
    batch_in_epoch: int = 0
    should_stop: bool = False
    stage: str | None = None
    epoch_finished: bool = False
    # Every rank's RNG states from a checkpoint, restored by the fit loop at the exact point of
    # the interrupted run (after the resumed epoch's iterator is rebuilt), not when loading.
    rng_to_restore: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("stage", "should_stop", "rng_to_restore")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("current_epoch", "global_step", "batch_in_epoch", "epoch_finished"):
            if key in state:
                setattr(self, key, state[key])


@dataclass
class TrainerStatus:
    """What the trainer is doing right now (Lightning's `trainer.state`)."""

    fn: str | None = None
    stage: str | None = None
    finished: bool = False
    extras: dict[str, Any] = field(default_factory=dict)
