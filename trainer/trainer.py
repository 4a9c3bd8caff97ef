"""Trainer: Lightning's arguments and entry points; the loops live in trainer/loops/.

`fit`/`validate`/`test`/`predict` hand one function, `_run_stage`, to `strategy.launch`, which
runs it in every worker process (or in this one). What rank 0 computed comes back and is
applied to the caller's module and this Trainer, so after `fit` the model holds the trained
weights, exactly as with a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from strategies import Strategy, resolve_strategy
from strategies.checkpoint_io import CheckpointError
from trainer.callbacks.base import Callback
from trainer.callbacks.dispatch import CallbackList, checkpoints_last
from trainer.checkpointing import build_checkpoint
from trainer.logged_metrics import MetricStore
from trainer.loggers.base import Logger
from trainer.optimizers import LRSchedulerConfig
from trainer.precision import Precision, normalize_precision
from trainer.run import run_stage
from trainer.state import LoopState, TrainerStatus
from trainer.validation import validate_trainer_args


@dataclass
class StageResult:
    """What global rank 0 sends back to the launching process after a stage."""

    pid: int
    output: Any = None
    state_dict: dict[str, Any] = field(default_factory=dict)
    loop_state: dict[str, Any] = field(default_factory=dict)
    callback_states: dict[str, Any] = field(default_factory=dict)
    callback_metrics: dict[str, Any] = field(default_factory=dict)
    logged_metrics: dict[str, float] = field(default_factory=dict)
    progress_bar_metrics: dict[str, float] = field(default_factory=dict)


class Trainer:
    """Runs Lightning-style training with a pluggable `Strategy` (see docs/trainer-contract.md)."""

    def __init__(
        self,
        accelerator: str = "auto",
        devices: int | str = "auto",
        num_nodes: int = 1,
        strategy: str | Strategy = "auto",
        precision: str | int = "32-true",
        max_epochs: int | None = None,
        max_steps: int = -1,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        val_check_interval: float | int = 1.0,
        check_val_every_n_epoch: int | None = 1,
        limit_train_batches: float | int = 1.0,
        limit_val_batches: float | int = 1.0,
        limit_test_batches: float | int = 1.0,
        limit_predict_batches: float | int = 1.0,
        log_every_n_steps: int = 50,
        callbacks: list[Callback] | Callback | None = None,
        logger: Logger | list[Logger] | bool | None = True,
        default_root_dir: str | os.PathLike[str] | None = None,
        enable_progress_bar: bool = True,
        enable_checkpointing: bool = True,
        enable_model_summary: bool = True,
        enable_telemetry: bool = True,
        deterministic: bool = False,
        fast_dev_run: bool | int = False,
        num_sanity_val_steps: int = 0,
        use_distributed_sampler: bool = True,
        benchmark: bool | None = None,
        on_nonfinite: str = "error",
    ) -> None:
        devices = 1 if devices == "auto" else devices
        validate_trainer_args(locals())
        self.default_root_dir = os.fspath(default_root_dir) if default_root_dir is not None else os.getcwd()
        self.num_devices, self.num_nodes = int(devices), int(num_nodes)
        self.precision = normalize_precision(precision)
        self.fast_dev_run = int(fast_dev_run)
        self.max_epochs = 1 if self.fast_dev_run else (max_epochs if max_epochs is not None or max_steps >= 0 else 1000)
        self.max_steps = self.fast_dev_run or max_steps
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val, self.gradient_clip_algorithm = gradient_clip_val, gradient_clip_algorithm
        self.val_check_interval = 1.0 if self.fast_dev_run else val_check_interval
        self.check_val_every_n_epoch = check_val_every_n_epoch
        limit = self.fast_dev_run or None
        self.limit_train_batches = limit or limit_train_batches
        self.limit_val_batches = limit or limit_val_batches
        self.limit_test_batches = limit or limit_test_batches
        self.limit_predict_batches = limit or limit_predict_batches
        self.log_every_n_steps = 1 if self.fast_dev_run else log_every_n_steps
        self.deterministic, self.benchmark = deterministic, benchmark
        self.enable_model_summary = enable_model_summary
        self.use_distributed_sampler = use_distributed_sampler
        self.on_nonfinite = on_nonfinite

        self.strategy = resolve_strategy(strategy, self.num_devices, self.num_nodes)
        self.strategy.configure(accelerator=None if accelerator == "auto" else accelerator,
                                devices=self.num_devices, num_nodes=self.num_nodes)
        self.loggers = self._build_loggers(logger)
        self.callback_list = CallbackList(self._build_callbacks(callbacks, enable_checkpointing, enable_progress_bar,
                                                                enable_telemetry))
        self.loop_state = LoopState()
        self.state = TrainerStatus()
        self.metric_store = MetricStore(self.strategy.reduce, ranks=self.strategy)
        self.precision_plugin = Precision(self.precision, self.strategy.root_device.type)
        self.optimizers: list[torch.optim.Optimizer] = []
        self.wrapped_optimizers: list[Any] = []
        self.lr_scheduler_configs: list[LRSchedulerConfig] = []
        self.lightning_module: nn.Module | None = None
        self.datamodule: Any = None
        self.num_training_batches: int = 0
        self.num_val_batches: list[int] = []
        self.interrupted = False

    # ------------------------------------------------------------------ construction helpers
    def _build_loggers(self, logger: Logger | list[Logger] | bool | None) -> list[Logger]:
        if self.fast_dev_run or logger is None or logger is False:
            return []
        if logger is True:
            from trainer.loggers import TensorBoardLogger

            return [TensorBoardLogger(save_dir=self.default_root_dir)]
        loggers = list(logger) if isinstance(logger, (list, tuple)) else [logger]
        for item in loggers:
            if not isinstance(item, Logger):
                raise TypeError(f"logger must be a trainer.loggers.Logger, a list of them, True or False; "
                                f"got {type(item).__name__}.")
        return loggers

    def _build_callbacks(self, callbacks: list[Callback] | Callback | None, checkpointing: bool,
                         progress_bar: bool, telemetry: bool) -> list[Callback]:
        result = [callbacks] if isinstance(callbacks, Callback) else list(callbacks or [])
        if not isinstance(telemetry, bool):
            raise TypeError(f"enable_telemetry must be True or False, got {telemetry!r}.")
        if telemetry and not self.fast_dev_run:
            from trainer.callbacks.telemetry import TelemetryMonitor

            if not any(isinstance(c, TelemetryMonitor) for c in result):
                result.append(TelemetryMonitor())
        if checkpointing and not self.fast_dev_run:
            from trainer.callbacks import ModelCheckpoint

            if not any(isinstance(c, ModelCheckpoint) for c in result):
                result.append(ModelCheckpoint())
        if progress_bar:
            from trainer.callbacks import TQDMProgressBar

            if not any(isinstance(c, TQDMProgressBar) for c in result):
                result.append(TQDMProgressBar())
        return checkpoints_last(result)

    # ------------------------------------------------------------------ entry points
    def fit(self, model: nn.Module, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: Any = None, ckpt_path: str | None = None) -> None:
        """Train `model`; afterwards it holds the trained weights (also after multi-process runs)."""
        self._launch("fit", model, dict(train_dataloaders=train_dataloaders, val_dataloaders=val_dataloaders,
                                        datamodule=datamodule, ckpt_path=ckpt_path))

    def validate(self, model: nn.Module | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
                 datamodule: Any = None, verbose: bool = True) -> list[dict[str, float]]:
        return self._launch("validate", model, dict(dataloaders=dataloaders, datamodule=datamodule,
                                                    ckpt_path=ckpt_path))

    def test(self, model: nn.Module | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
             datamodule: Any = None, verbose: bool = True) -> list[dict[str, float]]:
        return self._launch("test", model, dict(dataloaders=dataloaders, datamodule=datamodule, ckpt_path=ckpt_path))

    def predict(self, model: nn.Module | None = None, dataloaders: Any = None, datamodule: Any = None,
                ckpt_path: str | None = None) -> Any:
        return self._launch("predict", model, dict(dataloaders=dataloaders, datamodule=datamodule,
                                                   ckpt_path=ckpt_path))

    def _launch(self, stage: str, model: nn.Module | None, data: dict[str, Any]) -> Any:
        model = model if model is not None else self.lightning_module
        if model is None:
            raise TypeError(f"Trainer.{stage}() needs a model: pass one, or call fit(model) first.")
        ckpt_path = data.get("ckpt_path")
        if ckpt_path not in (None, "last", "best") and not os.path.isfile(ckpt_path):
            raise CheckpointError(f"ckpt_path={ckpt_path!r} does not exist; pass a checkpoint file, 'last' or None.")
        for logger in self.loggers:
            _ = logger.version  # decided here, once, so every worker writes to the same directory
        data = {**data, "launcher_pid": os.getpid()}
        result: StageResult = self.strategy.launch(run_stage, self, stage, model, data)
        if result.pid != os.getpid():
            self._absorb(result, model)
        self.lightning_module = model
        return result.output

    def _absorb(self, result: StageResult, model: nn.Module) -> None:
        """Apply rank 0's outcome to this (launching) process."""
        if result.state_dict:
            model.load_state_dict(result.state_dict)
        self.loop_state.load_state_dict(result.loop_state)
        self.callback_list.load_state_dict(result.callback_states)
        self.metric_store.callback_metrics.update(result.callback_metrics)
        self.metric_store.logged_metrics.update(result.logged_metrics)
        self.metric_store.progress_bar_metrics.update(result.progress_bar_metrics)

    # ------------------------------------------------------------------ used by loops and callbacks
    def save_checkpoint(self, filepath: str | os.PathLike[str], weights_only: bool = False) -> None:
        """Collective: every rank calls it; global rank 0 writes atomically; all wait."""
        if self.lightning_module is None:
            raise RuntimeError("save_checkpoint() needs a model attached: call it during or after fit().")
        module = self.strategy.unwrap(self.lightning_module)
        checkpoint = build_checkpoint(self, module, weights_only)
        self.strategy.save_checkpoint(checkpoint, filepath)

    def write_logger_metrics(self) -> None:
        """Send what the metric store has due to every logger, on global rank 0 only."""
        metrics = self.metric_store.pop_logger_metrics()
        if metrics and self.is_global_zero:
            metrics = {**metrics, "epoch": float(self.current_epoch)}
            for logger in self.loggers:
                logger.log_metrics(metrics, step=self.logger_step)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_global_zero:
            print(*args, **kwargs)

    # ------------------------------------------------------------------ read-only state
    @property
    def logger_step(self) -> int:
        """The step that metrics are logged at: the index of the last optimizer step (0 before any),
        as in Lightning, so a run's curves line up with the same run under Lightning."""
        return max(0, self.global_step - 1)

    @property
    def global_step(self) -> int:
        return self.loop_state.global_step

    @property
    def current_epoch(self) -> int:
        return self.loop_state.current_epoch

    @property
    def should_stop(self) -> bool:
        return self.loop_state.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.loop_state.should_stop = bool(value)

    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        return self.strategy.node_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def callbacks(self) -> list[Callback]:
        return self.callback_list.callbacks

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        return self.metric_store.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, float]:
        return self.metric_store.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        return self.metric_store.progress_bar_metrics

    @property
    def logger(self) -> Logger | None:
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        logger = self.logger
        return (logger.log_dir if logger is not None else None) or self.default_root_dir

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        return [c for c in self.callbacks if hasattr(c, "best_model_path")]

    @property
    def checkpoint_callback(self) -> Any:
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def early_stopping_callback(self) -> Any:
        from trainer.callbacks import EarlyStopping

        found = self.callback_list.of_type(EarlyStopping)
        return found[0] if found else None

    @property
    def progress_bar_callback(self) -> Any:
        from trainer.callbacks import TQDMProgressBar

        found = self.callback_list.of_type(TQDMProgressBar)
        return found[0] if found else None

    @property
    def estimated_stepping_batches(self) -> int:
        per_epoch = max(1, self.num_training_batches // self.accumulate_grad_batches)
        by_epochs = per_epoch * self.max_epochs if self.max_epochs not in (None, -1) else None
        candidates = [n for n in (by_epochs, self.max_steps if self.max_steps >= 0 else None) if n is not None]
        return min(candidates) if candidates else -1

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
    def sanity_checking(self) -> bool:
        return False

    def __getstate__(self) -> dict[str, Any]:
        # The module travels to workers as its own argument; the trainer never carries it.
        state = self.__dict__.copy()
        state.update(lightning_module=None, datamodule=None, optimizers=[], wrapped_optimizers=[],
                     lr_scheduler_configs=[])
        return state
