"""A module that delivers a preemption notice to itself, a peer or the launching process at a
chosen step of its first run (importable by spawned workers)."""

from __future__ import annotations

import os
import time
import signal
from typing import Any

import torch

from tests.helpers.models import DropoutRegressor
from trainer import LightningModule
from trainer.callbacks import Callback


class NoticeAtStep(DropoutRegressor):
    """At `global_step == step`, `signal_name` goes to: this rank (`to="rank1"`, `"rank0"`), every
    rank (`"all"`: each signals itself) or `launcher_pid` (`"launcher"`). A resumed run starts past
    `step`, so only the first run is signalled."""

    def __init__(self, step: int, to: str = "rank1", signal_name: str = "SIGTERM", launcher_pid: int = 0,
                 lr: float = 0.05) -> None:
        super().__init__(lr=lr)
        self.step, self.target, self.signal_name, self.launcher_pid = step, to, signal_name, launcher_pid

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.step:
            self._notify()
        return super().training_step(batch, batch_idx)

    def _notify(self) -> None:
        number = signal.Signals[self.signal_name]
        if self.target == "launcher" and self.global_rank == 0:
            os.kill(self.launcher_pid, number)
        elif self.target == "all" or self.target == f"rank{self.global_rank}":
            os.kill(os.getpid(), number)


class MarkReady(Callback):
    """A callback for CLI runs: global rank 0 writes `path` after `step` optimizer steps, so a test
    knows training is under way before it sends a notice from outside."""

    def __init__(self, path: str, step: int = 3) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            with open(self.path, "w") as handle:
                handle.write(str(os.getpid()))


class StuckAfterNotice(NoticeAtStep):
    """Rank 0 notifies the launching process at `step`; rank 1 is stuck in its own code from then on,
    so no step boundary comes: only the grace deadline can end the job before a SIGKILL."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.step and self.global_rank == 1:
            time.sleep(120)
        return super().training_step(batch, batch_idx)


class SeesSigterm(Callback):
    """Records `trainer.received_sigterm` (Lightning's flag) at every batch end into `seen`."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append(trainer.received_sigterm)


class ManualEveryOtherBatch(LightningModule):
    """Manual optimization that steps on even batches only: odd batches issue no collective at all,
    which the stop agreement must make up for. Rank `notice_rank` gets SIGTERM at batch 2 of the
    first epoch and is slow at that boundary, so the other rank reaches the next boundary first."""

    def __init__(self, notice_rank: int = -1) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.notice_rank = notice_rank
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        if batch_idx % 2 == 1:
            return None
        if self.global_rank == self.notice_rank and self.current_epoch == 0 and batch_idx == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        optimizer = self.optimizers()
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_rank == self.notice_rank and self.current_epoch == 0 and batch_idx == 2:
            time.sleep(1.0)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SignalAtStepSteps:
    """Step bodies for a linear regressor `self.net` that sends itself SIGTERM at `self.notice_at`;
    mixed into our LightningModule or Lightning's, so both Trainers run the same code."""

    net: torch.nn.Module
    notice_at: int
    global_step: int
    log: Any

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.notice_at:
            os.kill(os.getpid(), signal.SIGTERM)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))
