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
elastic restarts (torchrun) start whole new processes from the script and need none of this.
State a module keeps outside its `state_dict` is not covered, as it is not in a checkpoint either.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainer.contract import TrainerContract
from trainer.state import FitProgress


@dataclass(frozen=True)
class _FitStart:
    """Copies of what a fit's first attempt may change on the objects it runs on."""

    module: dict[str, torch.Tensor]
    progress: dict[str, Any]
    callbacks: list[tuple[Any, dict[str, Any]]]  # (the callback, its state_dict then)
    datamodule: dict[str, Any] | None


_REMEMBERED: dict[int, _FitStart] = {}  # id(trainer) -> its fit's start, while the fit may be restarted


@contextlib.contextmanager
def remembered_for_restarts(trainer: TrainerContract, progress: FitProgress, stage: str, model: nn.Module,
                            datamodule: Any) -> Iterator[None]:
    """Keep the fit's starting state while it runs, when the strategy may restart it (`max_restarts` > 0)."""
    if stage != "fit" or trainer.strategy.max_restarts == 0:
        yield
        return
    _REMEMBERED[id(trainer)] = _FitStart(
        # on the host: a GPU model's weights are not held twice on the device for the whole fit
        module={name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()},
        progress=copy.deepcopy(progress.state_dict()),
        callbacks=[(callback, copy.deepcopy(callback.state_dict())) for callback in trainer.callbacks
                   if hasattr(callback, "state_dict")],
        datamodule=copy.deepcopy(datamodule.state_dict()) if hasattr(datamodule, "state_dict") else None)
    try:
        yield
    finally:
        _REMEMBERED.pop(id(trainer), None)


def put_back_for_restart(trainer: TrainerContract, progress: FitProgress, model: nn.Module, datamodule: Any) -> None:
    """In a restarted attempt (`restart_count` > 0), give the objects this process ran the failed attempt on
    the state they had when the fit began; a no-op elsewhere (a pool worker's objects are already fresh)."""
    start = _REMEMBERED.get(id(trainer))
    if start is None or trainer.strategy.restart_count == 0:
        return
    model.load_state_dict(start.module)
    progress.load_state_dict(copy.deepcopy(start.progress))
    for callback, state in start.callbacks:
        callback.load_state_dict(copy.deepcopy(state))
    if start.datamodule is not None:
        datamodule.load_state_dict(copy.deepcopy(start.datamodule))
