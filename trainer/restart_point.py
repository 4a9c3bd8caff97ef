"""What a restarted attempt of a fit starts from on the ranks that ran the failed one (`max_restarts`).

When our launcher restarts a failed group (`DDPStrategy(max_restarts=K)`), the workers of the new attempt
start from the stage's payload: the model, Trainer, callbacks and datamodule as they were when the fit
began. Global rank 0 runs in the caller's process on the user's own objects, which the failed attempt
changed: trained weights, the step counter, callback and datamodule state. A restart that then finds a
checkpoint loads it over all of that on every rank, but one that fails before the first checkpoint used to
go on from rank 0's trained weights (broadcast to the fresh workers) with the step counter where the failed
attempt stopped, so it did not end where an uninterrupted run ends (the fault harness found it:
`python -m benchmarks.faults --scenario crash --seed 6`, a rank failing at step 1).

So when such a fit is launched, this module keeps what those objects held (`remembered_for_restarts`, on
the caller's side, in this process only: it is never pickled into a payload); a restarted attempt puts it
back first (`put_back_for_restart`), on rank 0 and on ranks forked from it, before any hook runs. Torch
elastic restarts (torchrun) start whole new processes from the script and need none of this, so nothing is
kept when the ranks were started outside (`Strategy.restarts_in_process` is 0). Callbacks' states follow the
checkpoint's rule (the non-empty ones, by `state_key`). Not covered, as a checkpoint does not cover them either:
state a module keeps outside its `state_dict`, and callbacks that `configure_callbacks` returns (made anew each
attempt unless the module caches them).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch
from torch import nn

from trainer.contract import TrainerContract
from trainer.state import FitProgress


class _CallbackStates(Protocol):
    """The Trainer's callback list (trainer/callbacks/dispatch.py), by what this module uses of it."""

    callbacks: list[Any]

    def state_dict(self) -> dict[str, Any]: ...


class RestartableTrainer(TrainerContract, Protocol):
    """What a restart puts back besides the model: the fit's progress and the callbacks' states."""

    @property
    def progress(self) -> FitProgress: ...
    @property
    def callback_list(self) -> _CallbackStates: ...


@dataclass(frozen=True)
class _FitStart:
    """Copies of what a fit's first attempt may change on the objects it runs on."""

    module: dict[str, Any]
    progress: FitProgress
    callbacks: dict[str, Any]  # state_key -> state, the non-empty ones (the checkpoint's rule)
    datamodule: dict[str, Any] | None


_REMEMBERED: dict[int, _FitStart] = {}  # id(trainer) -> its fit's start, while the fit may be restarted


@contextlib.contextmanager
def remembered_for_restarts(trainer: RestartableTrainer, stage: str, model: nn.Module,
                            datamodule: Any) -> Iterator[None]:
    """Keep the fit's starting state while it runs, when the strategy may restart it in this process."""
    if stage != "fit" or trainer.strategy.restarts_in_process == 0:
        yield
        return
    _REMEMBERED[id(trainer)] = _FitStart(
        module={name: _host_copy(value) for name, value in model.state_dict().items()},
        progress=copy.deepcopy(trainer.progress),
        callbacks=copy.deepcopy(trainer.callback_list.state_dict()),
        datamodule=copy.deepcopy(datamodule.state_dict()) if hasattr(datamodule, "state_dict") else None)
    try:
        yield
    finally:
        _REMEMBERED.pop(id(trainer), None)


def put_back_for_restart(trainer: RestartableTrainer, model: nn.Module, datamodule: Any) -> None:
    """In a restarted attempt (`restart_count` > 0), give the objects this process ran the failed attempt on
    the state they had when the fit began; a no-op elsewhere (a pool worker's objects are already fresh)."""
    start = _REMEMBERED.get(id(trainer))
    if start is None or trainer.strategy.restart_count == 0:
        return
    model.load_state_dict(start.module)
    for field in fields(FitProgress):  # every field, also those a checkpoint's state_dict leaves out
        setattr(trainer.progress, field.name, copy.deepcopy(getattr(start.progress, field.name)))
    for callback in trainer.callback_list.callbacks:
        state = start.callbacks.get(callback.state_key)
        if state is None:
            continue
        state = copy.deepcopy(state)
        if "dirpath" in state and state["dirpath"] is None:
            # a ModelCheckpoint resolves its directory in setup, after the fit began: the same directory
            state["dirpath"] = getattr(callback, "dirpath", None)
        callback.load_state_dict(state)
    if start.datamodule:
        datamodule.load_state_dict(copy.deepcopy(start.datamodule))


def _host_copy(value: Any) -> Any:
    """A state_dict value kept apart from the module: a tensor on the host (a GPU model's weights are not held
    twice on the device for the whole fit), anything else (a module's extra state) deep-copied."""
    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else copy.deepcopy(value)
