"""What a restarted fit puts back on the objects the failed attempt ran on (trainer/restart_point.py); the
end-to-end check against an uninterrupted run is tests/distributed/test_recovery.py."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.restart_point import put_back_for_restart, remembered_for_restarts
from trainer.state import FitProgress


class _WithExtraState(nn.Linear):
    """A module whose state_dict holds a non-tensor (get_extra_state), as some quantised layers' do."""

    def __init__(self) -> None:
        super().__init__(2, 2)
        self.calls = 0

    def get_extra_state(self) -> Any:
        return {"calls": self.calls}

    def set_extra_state(self, state: Any) -> None:
        self.calls = state["calls"]


class _Counter:
    state_key = "counter"

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]


class _Callbacks:
    def __init__(self, *callbacks: Any) -> None:
        self.callbacks = list(callbacks)

    def state_dict(self) -> dict[str, Any]:
        return {c.state_key: c.state_dict() for c in self.callbacks if c.state_dict()}


class _Strategy:
    restarts_in_process = 1
    restart_count = 0


class _Trainer:
    def __init__(self) -> None:
        self.strategy, self.progress, self.callback_list = _Strategy(), FitProgress(global_step=3), _Callbacks(_Counter())


def test_a_restarted_attempt_gets_the_fits_start_back_extra_state_and_unsaved_fields_included() -> None:
    trainer, module = _Trainer(), _WithExtraState()
    weight = module.weight.detach().clone()
    with remembered_for_restarts(trainer, "fit", module, None):  # type: ignore[arg-type]
        with torch.no_grad():
            module.weight.add_(1.0)
        module.calls, trainer.progress.global_step, trainer.progress.step_in_flight = 5, 9, True
        trainer.callback_list.callbacks[0].count = 4
        put_back_for_restart(trainer, module, None)  # type: ignore[arg-type]
        assert module.calls == 5  # the first attempt (restart_count 0): nothing is put back
        trainer.strategy.restart_count = 1
        put_back_for_restart(trainer, module, None)  # type: ignore[arg-type]
    assert torch.equal(module.weight, weight) and module.calls == 0
    assert trainer.progress.global_step == 3 and trainer.progress.step_in_flight is False
    assert trainer.callback_list.callbacks[0].count == 0


def test_nothing_is_kept_when_the_ranks_were_started_outside() -> None:
    trainer, module = _Trainer(), _WithExtraState()
    trainer.strategy.restarts_in_process = 0  # torchrun/SLURM, or one device: no restart in this process
    with remembered_for_restarts(trainer, "fit", module, None):  # type: ignore[arg-type]
        module.calls = 5
        trainer.strategy.restart_count = 1
        put_back_for_restart(trainer, module, None)  # type: ignore[arg-type]
    assert module.calls == 5
