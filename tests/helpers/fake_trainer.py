"""A stand-in Trainer for callback and logger unit tests.

`FakeTrainer` exposes the public attributes of docs/trainer-contract.md that callbacks read,
runs on a single-process `Strategy` and writes real checkpoint files. Two fake trainers can act
as rank 0 and rank 1 of one job: give them one `BroadcastChannel` and run rank 0's hook first;
rank 1's `broadcast` then returns what rank 0 broadcast, as a real collective would.
"""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace
from typing import Any

import torch

from strategies.base import Strategy
from trainer.callbacks.dispatch import is_checkpoint, is_early_stopping, is_progress_bar
from trainer.state import TrainerStatus


class BroadcastChannel:
    """What rank 0 broadcast, in order, for the other fake ranks to read back."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.read: dict[int, int] = {}

    def receive(self, rank: int) -> Any:
        index = self.read.get(rank, 0)
        self.read[rank] = index + 1
        return copy.deepcopy(self.sent[index])  # a real broadcast pickles: no shared objects


class FakeStrategy(Strategy):
    def __init__(self, global_rank: int = 0, world_size: int = 1, channel: BroadcastChannel | None = None) -> None:
        super().__init__(accelerator="cpu")
        self._rank, self._world_size = global_rank, world_size
        self.channel = channel or BroadcastChannel()
        self.removed: list[str] = []

    def setup_environment(self) -> None:
        pass

    @property
    def global_rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self._rank == src:
            self.channel.sent.append(copy.deepcopy(obj))
            return obj
        return self.channel.receive(self._rank)

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        self.removed.append(str(path))
        super().remove_checkpoint(path)


class FakeTrainer:
    def __init__(self, root: Any, *, global_rank: int = 0, world_size: int = 1, loggers: list[Any] | None = None,
                 callbacks: list[Any] | None = None, channel: BroadcastChannel | None = None,
                 num_training_batches: int = 4, num_val_batches: list[int] | None = None) -> None:
        self.strategy = FakeStrategy(global_rank, world_size, channel)
        self.default_root_dir = str(root)
        self.loggers = list(loggers or [])
        self.callbacks = list(callbacks or [])
        self.global_step = 0
        self.current_epoch = 0
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.logged_metrics: dict[str, torch.Tensor] = {}
        self.progress_bar_metrics: dict[str, torch.Tensor] = {}
        self.fast_dev_run = False
        self.sanity_checking = False
        self.predict_loop = SimpleNamespace(current_batch_indices=[], epoch_batch_indices=[], predictions=[])
        self.should_stop = False
        self.log_every_n_steps = 1
        self.val_check_interval: float | int = 1.0
        self.check_val_every_n_epoch: int | None = 1
        self.num_training_batches = num_training_batches
        self.num_val_batches = [2] if num_val_batches is None else num_val_batches
        self.optimizers: list[Any] = []
        self.lr_scheduler_configs: list[Any] = []
        self.lightning_module = None
        self.saved: list[tuple[str, bool]] = []
        self.printed: list[str] = []
        # the rest of trainer/contract.py's surface (tests/unit/trainer/test_contract.py checks it is all here)
        self.state = TrainerStatus()
        self.accumulate_grad_batches = 1
        self.max_epochs: int | None = None
        self.max_steps = -1
        self.precision = "32-true"
        self.num_devices, self.num_nodes = world_size, 1
        self.ckpt_path: str | None = None
        self.datamodule: Any = None
        self.is_last_batch = False
        self.received_sigterm = False

    @property
    def interrupted(self) -> bool:
        return self.state.status == "interrupted"

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        return self.strategy.node_rank

    @property
    def model(self) -> Any:
        return self.lightning_module

    @property
    def training(self) -> bool:
        return self.state.stage == "train"

    @property
    def validating(self) -> bool:
        return self.state.stage == "validate"

    @property
    def testing(self) -> bool:
        return self.state.stage == "test"

    @property
    def predicting(self) -> bool:
        return self.state.stage == "predict"

    @property
    def enable_validation(self) -> bool:
        return bool(self.num_val_batches) and sum(self.num_val_batches) > 0

    @property
    def estimated_stepping_batches(self) -> int | float:
        return self.num_training_batches * (self.max_epochs or 1) // self.accumulate_grad_batches

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        return [callback for callback in self.callbacks if is_checkpoint(callback)]

    @property
    def checkpoint_callback(self) -> Any:
        return next(iter(self.checkpoint_callbacks), None)

    @property
    def early_stopping_callbacks(self) -> list[Any]:
        return [callback for callback in self.callbacks if is_early_stopping(callback)]

    @property
    def early_stopping_callback(self) -> Any:
        return next(iter(self.early_stopping_callbacks), None)

    @property
    def progress_bar_callback(self) -> Any:
        return next((callback for callback in self.callbacks if is_progress_bar(callback)), None)

    @property
    def logger_step(self) -> int:
        return max(0, self.global_step - 1)  # as Trainer.logger_step after a batch's step (one step per batch)

    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def logger(self) -> Any:
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        return self.logger.log_dir if self.logger is not None else self.default_root_dir

    def save_checkpoint(self, filepath: str, weights_only: bool = False) -> None:
        """Collective like the real one: every rank calls, the strategy writes on rank 0."""
        self.saved.append((str(filepath), weights_only))
        checkpoint: dict[str, Any] = {"epoch": self.current_epoch, "global_step": self.global_step,
                                      "state_dict": {"w": torch.zeros(1)}}
        if not weights_only:
            checkpoint["callbacks"] = {cb.state_key: cb.state_dict() for cb in self.callbacks}
        self.strategy.save_checkpoint(checkpoint, filepath)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_global_zero:
            self.printed.append(" ".join(map(str, args)))

    # ------------------------------------------------------------------ driving hooks
    def call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, self.lightning_module, *args)

    def fit(self, epochs: int, val_metrics: Any = None, train_metrics: Any = None, stage: str = "fit") -> None:
        """Drive the documented hook order: `val_metrics(epoch)` / `train_metrics(step)` return the
        metrics that validation / a training step logs (None: nothing logged)."""
        self.call("setup", stage)
        self.call("on_fit_start")
        self.call("on_train_start")
        for epoch in range(epochs):
            self.current_epoch = epoch
            self.call("on_train_epoch_start")
            for batch_idx in range(self.num_training_batches):
                self.call("on_train_batch_start", None, batch_idx)
                self.global_step += 1
                if train_metrics is not None:
                    self.callback_metrics.update(_tensors(train_metrics(self.global_step)))
                self.call("on_train_batch_end", None, None, batch_idx)
            if sum(self.num_val_batches) and val_metrics is not None:
                self.validate(val_metrics(epoch))
            self.call("on_train_epoch_end")
            if self.should_stop:
                break
        self.call("on_train_end")
        self.call("on_fit_end")
        self.call("teardown", stage)

    def validate(self, metrics: dict[str, float]) -> None:
        self.call("on_validation_start")
        self.call("on_validation_epoch_start")
        for batch_idx in range(sum(self.num_val_batches)):
            self.call("on_validation_batch_end", None, None, batch_idx)
        self.callback_metrics.update(_tensors(metrics))
        self.call("on_validation_epoch_end")
        self.call("on_validation_end")


def _tensors(metrics: dict[str, float]) -> dict[str, torch.Tensor]:
    return {key: torch.tensor(float(value)) for key, value in metrics.items()}


def scheduler_config(scheduler: Any, interval: str = "epoch", name: str | None = None) -> SimpleNamespace:
    """The fields of the Trainer's LRSchedulerConfig that LearningRateMonitor reads."""
    return SimpleNamespace(scheduler=scheduler, interval=interval, frequency=1, monitor=None, name=name, strict=True)


class RecordingLogger:
    """A Logger-shaped recorder for callbacks that log (no files)."""

    name = "recording"
    version = 0
    log_dir = None

    def __init__(self) -> None:
        self.metrics: list[tuple[dict[str, float], int]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.metrics.append((dict(metrics), step))

    def log_hyperparams(self, params: Any) -> None:
        pass
