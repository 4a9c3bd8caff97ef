"""Trainer: Lightning's arguments and entry points; the loops live in trainer/loops/.

`fit`/`validate`/`test`/`predict` hand one function, `run_stage`, to `strategy.launch`, which
runs it here as global rank 0 (and on copies in the other ranks' workers), so after any stage
the module, callbacks, loggers and this Trainer are the objects that ran, exactly as with a
single process or Lightning's `ddp`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from strategies import Strategy, resolve_strategy
from strategies.rank_zero import rank_zero_warn
from trainer.callbacks.dispatch import (CallbackList, adopt_callback, checkpoints_last, is_checkpoint,
                                       is_early_stopping, is_model_summary, is_progress_bar)
from trainer.checkpointing import build_checkpoint, require_checkpoint_file
from trainer.combined_loader import CombinedLoader
from trainer.compiled import unwrap_compiled
from trainer.logged_metrics import MetricStore
from trainer.data_sources import DataSources, is_datamodule
from trainer.lightning_views import FitLoopView, LoggerConnectorView, PredictLoopView
from trainer.loggers.base import DummyLogger, is_logger
from trainer.optimizers import LRSchedulerConfig
from trainer.profiler import is_profiling, resolve_profiler
from trainer.precision import Precision, normalize_precision
from trainer.loops.fit_loop import effective_max_epochs, settle_max_epochs, validation_every
from trainer.loops.nonfinite import NonFiniteWatch
from trainer.loops.prediction_run import PredictionRun
from trainer.run import run_stage
from trainer.state import LoopState, TrainerStatus
from trainer.validation import apply_backend_flags, as_items, defaults_from_env, resolve_trainer_args


class Trainer:
    """Runs Lightning-style training with a pluggable `Strategy` (see docs/trainer-contract.md).

    The arguments are Lightning 2.6's, keyword-only, with its defaults; `None` means "Lightning's
    default" where Lightning uses `None` that way. Beyond Lightning: `enable_telemetry` and
    `on_nonfinite`."""

    @defaults_from_env
    def __init__(
        self,
        *,
        accelerator: str = "auto",
        strategy: str | Strategy = "auto",
        devices: int | str = "auto",
        num_nodes: int = 1,
        precision: str | int | None = None,
        logger: Any = None,
        callbacks: Any = None,
        fast_dev_run: bool | int = False,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        max_time: Any = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        log_every_n_steps: int | None = None,
        enable_checkpointing: bool | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
        deterministic: bool | str | None = None,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        use_distributed_sampler: bool = True,
        profiler: Any = None,
        detect_anomaly: bool = False,
        barebones: bool = False,
        plugins: Any = None,
        sync_batchnorm: bool = False,
        reload_dataloaders_every_n_epochs: int = 0,
        default_root_dir: str | os.PathLike[str] | None = None,
        enable_autolog_hparams: bool = True,
        model_registry: str | None = None,
        enable_telemetry: bool = True,
        on_nonfinite: str = "error",
    ) -> None:
        args = resolve_trainer_args(locals())
        self.barebones = barebones
        self.default_root_dir = os.path.expanduser(os.fspath(default_root_dir)) if default_root_dir is not None \
            else os.getcwd()
        self.num_devices, self.num_nodes = int(args["devices"]), int(num_nodes)
        self.precision = normalize_precision(args["precision"])
        self.fast_dev_run: bool | int = True if fast_dev_run == 1 else fast_dev_run  # Lightning's: 1 reads True
        # Lightning: None with max_steps set means no epoch limit (-1); None alone stays None until fit
        # starts, which makes it 1000 (or -1 with max_time): loops/fit_loop.settle_max_epochs
        self.max_epochs = 1 if self.fast_dev_run else (-1 if max_epochs is None and max_steps != -1 else max_epochs)
        self.min_epochs, self.min_steps = min_epochs, min_steps
        self.max_steps = int(self.fast_dev_run) or max_steps
        self.max_time = args["max_time"]
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = gradient_clip_algorithm
        self.val_check_interval = 1.0 if self.fast_dev_run else args["val_check_interval"]
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.overfit_batches = overfit_batches
        self.limit_train_batches = args["limit_train_batches"]
        self.limit_val_batches = args["limit_val_batches"]
        self.limit_test_batches = args["limit_test_batches"]
        self.limit_predict_batches = args["limit_predict_batches"]
        self.num_sanity_val_steps = 0 if self.fast_dev_run else args["num_sanity_val_steps"]
        self.log_every_n_steps = 1 if self.fast_dev_run else args["log_every_n_steps"]
        self.deterministic, self.benchmark = deterministic, benchmark
        self.inference_mode, self.detect_anomaly = inference_mode, detect_anomaly
        self.enable_model_summary = args["enable_model_summary"]
        self.enable_autolog_hparams = enable_autolog_hparams
        self.use_distributed_sampler = use_distributed_sampler
        self.reload_dataloaders_every_n_epochs = reload_dataloaders_every_n_epochs
        self.on_nonfinite = on_nonfinite
        self.nonfinite_watch = NonFiniteWatch()  # a fresh one per fit (trainer/loops/nonfinite.py)
        apply_backend_flags(deterministic, benchmark)

        self.strategy = resolve_strategy(strategy, self.num_devices, self.num_nodes, sync_batchnorm=sync_batchnorm)
        self.strategy.configure(accelerator=None if accelerator == "auto" else accelerator,
                                devices=self.num_devices, num_nodes=self.num_nodes)
        self.loggers = self._build_loggers(args["logger"])
        self.profiler = resolve_profiler(profiler)
        self.callback_list = CallbackList(self._build_callbacks(
            callbacks, args["enable_checkpointing"], args["enable_progress_bar"], enable_telemetry and not barebones,
            args["enable_model_summary"]), profiler=self.profiler if is_profiling(self.profiler) else None)
        self.loop_state = LoopState()
        self.state = TrainerStatus()
        self.metric_store = MetricStore(self.strategy.reduce, ranks=self.strategy)
        self.precision_plugin = Precision(self.precision, self.strategy.root_device.type)
        self.optimizers: list[torch.optim.Optimizer] = []
        self.wrapped_optimizers: list[Any] = []
        self.lr_scheduler_configs: list[LRSchedulerConfig] = []
        self.lightning_module: nn.Module | None = None
        self.datamodule: Any = None
        self.data = DataSources()
        self.num_training_batches: int | float = float("inf")
        self._num_val_batches: dict[str, list[int | float]] = {}
        self.num_test_batches: list[int | float] = []
        self.num_predict_batches: list[int | float] = []
        self.num_sanity_val_batches: list[int | float] = []
        self.ckpt_path: str | None = None
        self.prediction_run: PredictionRun | None = None  # the latest predict run, for prediction writers
        self.preemption_watch: Any = None  # the latest fit's PreemptionWatch (trainer/loops/preemption.py)
        self.preemption_mark: dict[str, Any] | None = None  # while the preemption checkpoint is built
        self.resumed_after_preemption = False  # this fit resumed a preempted run: its checkpoint goes at the end
        self.fit_started_at = 0.0  # time.monotonic() when training started (max_time counts from there)
        self._fitted = False  # a fit ran on the current model: evaluating it without one may use "best"

    # ------------------------------------------------------------------ construction helpers
    def _build_loggers(self, logger: Any) -> list[Any]:
        if self.barebones or logger is None or logger is False:
            return []
        if self.fast_dev_run:
            return [DummyLogger()]  # Lightning: a fast_dev_run writes no logs, but self.logger still works
        if logger is True:
            from trainer.loggers import TensorBoardLogger

            return [TensorBoardLogger(save_dir=self.default_root_dir)]
        loggers = as_items(logger)
        for item in loggers:
            if not is_logger(item):
                raise TypeError(f"logger must be a Logger (ours or Lightning's), a list of them, True or False; "
                                f"got {type(item).__name__}.")
        return loggers

    def _build_callbacks(self, callbacks: Any, checkpointing: bool, progress_bar: bool,
                         telemetry: bool, model_summary: bool) -> list[Any]:
        """The user's callbacks, then (Lightning's order) the progress bar, the model summary and
        the checkpoint callback the flags ask for, and our telemetry; checkpointing runs last."""
        from trainer.callbacks import ModelCheckpoint, ModelSummary, TQDMProgressBar
        from trainer.callbacks.telemetry import TelemetryMonitor

        given = as_items(callbacks) if callbacks is not None else []
        result = [adopt_callback(callback) for callback in given]
        if not isinstance(telemetry, bool):
            raise TypeError(f"enable_telemetry must be True or False, got {telemetry!r}.")
        if progress_bar and not any(is_progress_bar(c) for c in result):
            result.append(TQDMProgressBar())
        if model_summary and not any(is_model_summary(c) for c in result):
            result.append(ModelSummary())
        if telemetry and not self.fast_dev_run and not any(isinstance(c, TelemetryMonitor) for c in result):
            result.append(TelemetryMonitor(log_to_loggers=False))  # the loggers get only what the user logs
        if not checkpointing and any(is_checkpoint(c) for c in result):
            raise ValueError("Trainer(enable_checkpointing=False) (or barebones=True) contradicts the ModelCheckpoint "
                             "in callbacks: remove the callback, or enable checkpointing.")
        if checkpointing and not self.fast_dev_run and not any(is_checkpoint(c) for c in result):
            result.append(ModelCheckpoint())
        return checkpoints_last(result)

    # ------------------------------------------------------------------ entry points
    def fit(self, model: nn.Module, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: Any = None, ckpt_path: str | None = None, weights_only: bool | None = None) -> None:
        """Train `model`; afterwards it holds the trained weights (also after multi-process runs).
        `weights_only=False` trusts `ckpt_path`: any pickled object in it is rebuilt (Lightning's meaning)."""
        settle_max_epochs(self)  # here, so the launching process's attribute and warning are those of the fit
        datamodule = _split_datamodule(train_dataloaders, datamodule)
        train_dataloaders = None if datamodule is train_dataloaders else train_dataloaders
        self._launch("fit", model, dict(train_dataloaders=train_dataloaders, val_dataloaders=val_dataloaders,
                                        datamodule=datamodule, ckpt_path=ckpt_path, weights_only=weights_only))

    def validate(self, model: nn.Module | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
                 verbose: bool = True, datamodule: Any = None, weights_only: bool | None = None) -> list[dict[str, float]]:
        return self._evaluate_entry("validate", model, dataloaders, ckpt_path, verbose, datamodule, weights_only)

    def test(self, model: nn.Module | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
             verbose: bool = True, datamodule: Any = None, weights_only: bool | None = None) -> list[dict[str, float]]:
        return self._evaluate_entry("test", model, dataloaders, ckpt_path, verbose, datamodule, weights_only)

    def predict(self, model: nn.Module | None = None, dataloaders: Any = None, datamodule: Any = None,
                return_predictions: bool | None = None, ckpt_path: str | None = None,
                weights_only: bool | None = None) -> Any:
        datamodule = _split_datamodule(dataloaders, datamodule)
        dataloaders = None if datamodule is dataloaders else dataloaders
        ckpt_path = self._default_ckpt_path("predict", model, ckpt_path)
        output = self._launch("predict", model, dict(dataloaders=dataloaders, datamodule=datamodule,
                                                     ckpt_path=ckpt_path, return_predictions=return_predictions,
                                                     weights_only=weights_only))
        return output if return_predictions is not False else None

    def _evaluate_entry(self, stage: str, model: nn.Module | None, dataloaders: Any, ckpt_path: str | None,
                        verbose: bool, datamodule: Any, weights_only: bool | None) -> list[dict[str, float]]:
        datamodule = _split_datamodule(dataloaders, datamodule)
        dataloaders = None if datamodule is dataloaders else dataloaders
        ckpt_path = self._default_ckpt_path(stage, model, ckpt_path)
        return self._launch(stage, model, dict(dataloaders=dataloaders, datamodule=datamodule, ckpt_path=ckpt_path,
                                               verbose=verbose, weights_only=weights_only))

    def _launch(self, stage: str, model: nn.Module | None, data: dict[str, Any]) -> Any:
        model = unwrap_compiled(model) if model is not None else None  # Lightning's meaning: see compiled.py
        if model is None:
            model = self.lightning_module
        elif stage != "fit" and self.lightning_module is not None and model is not self.lightning_module:
            self._fitted = False
        if model is None:
            raise TypeError(f"Trainer.{stage}() needs a model: pass one, or call fit(model) first.")
        if data.get("weights_only") not in (None, True, False):
            raise TypeError(f"weights_only={data['weights_only']!r} must be None, True or False.")
        require_checkpoint_file(data.get("ckpt_path"))
        if data.get("datamodule") is None:
            data["datamodule"] = self.datamodule if model is self.lightning_module else None
        for logger in self.loggers:
            _ = logger.version  # decided here, once, so every worker writes to the same directory
        data = {**data, "launcher_pid": os.getpid()}
        self.state.status = "running"
        try:
            output = self.strategy.launch(run_stage, self, stage, model, data)
        except KeyboardInterrupt:  # Ctrl-C: after the graceful shutdown the script ends, as under Lightning
            self._stage_ended(stage, model, "interrupted")
            raise SystemExit(1) from None
        except BaseException:
            self.state.status = "interrupted"
            raise
        self._stage_ended(stage, model, "finished")
        return output

    def _stage_ended(self, stage: str, model: nn.Module, status: str) -> None:
        self.lightning_module = model
        self._fitted = self._fitted or stage == "fit"
        self.state.status = status
        self.state.fn, self.state.stage = stage, None

    def _default_ckpt_path(self, stage: str, model: nn.Module | None, ckpt_path: str | None) -> str | None:
        """Lightning's rule: after a fit, evaluating without a model and without `ckpt_path` uses the
        best checkpoint of that fit; say so, since the weights are not the ones the fit ended with."""
        best = getattr(self.checkpoint_callback, "best_model_path", None)
        if model is not None or ckpt_path is not None or not self._fitted or not best:
            return ckpt_path
        rank_zero_warn(f"{stage}() was called without a model after fit(): it uses the best checkpoint of that fit "
                       f"({best}), not the weights the fit ended with. Pass ckpt_path='best', 'last', a file, or the "
                       "model itself to choose (and silence this).")
        return "best"

    # ------------------------------------------------------------------ used by loops and callbacks
    def save_checkpoint(self, filepath: str | os.PathLike[str], weights_only: bool = False,
                        storage_options: Any = None) -> None:
        """Collective: every rank calls it; global rank 0 writes atomically; all wait."""
        if self.lightning_module is None:
            raise RuntimeError("save_checkpoint() needs a model attached: call it during or after fit().")
        if storage_options is not None:
            raise TypeError("save_checkpoint(storage_options=...) is not supported: our checkpoint I/O writes local "
                            "files; pass a CheckpointIO to the strategy to write elsewhere.")
        self.nonfinite_watch.check(self)  # never save weights a non-finite step has already spoiled
        with self.profiler.profile("save_checkpoint"):
            module = self.strategy.unwrap(self.lightning_module)
            checkpoint = build_checkpoint(self, module, weights_only)
            self.strategy.save_checkpoint(checkpoint, filepath)

    def write_logger_metrics(self, step: int | None = None) -> None:
        """Send what the metric store has due to every logger, on global rank 0 only, at `step`
        (default: `logger_step`)."""
        if not (self.loggers and self.is_global_zero and not self.sanity_checking):
            self.metric_store.drop_logger_metrics()
            return
        metrics = self.metric_store.pop_logger_metrics()
        if metrics:
            metrics = {**metrics, "epoch": self.current_epoch}
            for logger in self.loggers:
                logger.log_metrics(metrics=metrics, step=self.logger_step if step is None else step)

    def write_eval_step_metrics(self, step: int) -> None:
        """An evaluation batch's step values, one logger row per batch at `step` (the batches that
        dataloader has run), without "epoch", as in Lightning."""
        metrics = self.metric_store.pop_eval_step_metrics()
        if metrics and self.is_global_zero and not self.sanity_checking:
            for logger in self.loggers:
                logger.log_metrics(metrics=metrics, step=step)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_global_zero:
            print(*args, **kwargs)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Build a module's tensors where it will train: on this process's device and, for
        "64-true", in float64, instead of on the CPU in float32 and converting afterwards."""
        if empty_init:
            raise ValueError("Trainer.init_module(empty_init=True) is not supported: parameters are always "
                             "initialised; pass empty_init=None or False.")
        dtype = self.precision_plugin.module_dtype
        previous = torch.get_default_dtype()
        with self.strategy.root_device:
            if dtype is not None:
                torch.set_default_dtype(dtype)
            try:
                yield
            finally:
                torch.set_default_dtype(previous)

    # ------------------------------------------------------------------ read-only state
    @property
    def logger_step(self) -> int:
        """The step that metrics are logged at: the number of batches that stepped before the current
        one (Lightning's count), so a run's curves line up with the same run under Lightning."""
        return self.loop_state.stepped_batches

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
    def is_last_batch(self) -> bool:
        return self.loop_state.is_last_batch

    @property
    def received_sigterm(self) -> bool:
        """Lightning's flag: in the latest fit, this rank received SIGTERM or learned that the ranks stop for
        one (a preemption notice, trainer/loops/preemption.py; SIGTERM among the strategy's preemption
        signals). Every rank sees it True by the agreed stop; the next fit starts it afresh."""
        watch = self.preemption_watch
        return watch is not None and "SIGTERM" in (watch.flag.received, watch.agreement.signal_name)

    @property
    def interrupted(self) -> bool:
        return self.state.status == "interrupted"

    @property
    def model(self) -> nn.Module | None:
        """The module the strategy trains (Lightning: the wrapped model; ours is the module itself,
        with the gradient reducer attached to its parameters)."""
        return self.lightning_module

    @property
    def predict_loop(self) -> PredictLoopView:
        """What prediction writers read of the current (or latest) predict run (see loops/prediction_run.py)."""
        return PredictLoopView(self.prediction_run)

    @property
    def fit_loop(self) -> FitLoopView:
        """Read-only: what Lightning's own callbacks read of Lightning's fit loop (trainer/lightning_views.py)."""
        return FitLoopView(self)

    @property
    def _logger_connector(self) -> LoggerConnectorView:
        return LoggerConnectorView(self)

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
    def device_ids(self) -> list[int]:
        return list(range(self.num_devices))

    @property
    def accelerator(self) -> str:
        return self.strategy.root_device.type

    @property
    def callbacks(self) -> list[Any]:
        return self.callback_list.callbacks

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        return self.metric_store.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, Any]:
        return self.metric_store.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        return self.metric_store.progress_bar_metrics

    @property
    def logger(self) -> Any:
        return self.loggers[0] if self.loggers else None

    @logger.setter
    def logger(self, logger: Any) -> None:
        self.loggers = [] if logger is None else [logger]

    @property
    def log_dir(self) -> str:
        logger = self.logger
        directory = getattr(logger, "log_dir", None) if logger is not None else None
        if directory is None and logger is not None:
            directory = getattr(logger, "save_dir", None)
        return os.fspath(directory) if directory is not None else self.default_root_dir

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        return [c for c in self.callbacks if hasattr(c, "best_model_path")]

    @property
    def checkpoint_callback(self) -> Any:
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def early_stopping_callbacks(self) -> list[Any]:
        return [c for c in self.callbacks if is_early_stopping(c)]

    @property
    def early_stopping_callback(self) -> Any:
        found = self.early_stopping_callbacks
        return found[0] if found else None

    @property
    def progress_bar_callback(self) -> Any:
        found = [c for c in self.callbacks if is_progress_bar(c)]
        return found[0] if found else None

    @property
    def val_check_batch(self) -> int | float:
        """Training batches between validations, from `val_check_interval` and the epoch's length (Lightning's
        attribute; inf when a fraction of an epoch meets a loader without a length)."""
        return validation_every(self)

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches per dataloader: `validate()`'s during validate, else fit's (each keeps its
        own, as Lightning's two validation loops do)."""
        return self._num_val_batches.get(self._validation_owner(), [])

    @num_val_batches.setter
    def num_val_batches(self, value: list[int | float]) -> None:
        self._num_val_batches[self._validation_owner()] = list(value)

    def _validation_owner(self) -> str:
        return "validate" if self.state.fn == "validate" else "fit"

    @property
    def enable_validation(self) -> bool:
        return self.data.val_defined(self) and self.limit_val_batches != 0

    @property
    def train_dataloader(self) -> Any:
        """The training loader, or the collection of them (as given, with samplers injected)."""
        loaders = self.data.loaders.get("train")
        if not loaders:
            return None
        return loaders[0].iterables if isinstance(loaders[0], CombinedLoader) else loaders[0]

    @property
    def val_dataloaders(self) -> Any:
        return _one_or_list(self.data.loaders.get("validate"))

    @property
    def test_dataloaders(self) -> Any:
        return _one_or_list(self.data.loaders.get("test"))

    @property
    def predict_dataloaders(self) -> Any:
        return _one_or_list(self.data.loaders.get("predict"))

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps this fit will take (Lightning's estimate, also inside configure_optimizers)."""
        per_epoch = self.num_training_batches
        if per_epoch == float("inf") and self.state.fn == "fit" and self.lightning_module is not None:
            per_epoch = self.data.count_training_batches(self)
        if per_epoch == float("inf"):
            return float("inf") if self.max_steps == -1 else self.max_steps
        steps = max(1, math.ceil(per_epoch / self.accumulate_grad_batches)) if per_epoch else 0
        max_epochs = effective_max_epochs(self)
        if max_epochs == -1:
            return float("inf") if self.max_steps == -1 else self.max_steps
        total = steps * max_epochs
        return total if self.max_steps == -1 else min(total, self.max_steps)

    @property
    def training(self) -> bool:
        return self.state.stage == "train"

    @training.setter
    def training(self, value: bool) -> None:
        self._set_stage("train", value)

    @property
    def validating(self) -> bool:
        return self.state.stage == "validate"

    @validating.setter
    def validating(self, value: bool) -> None:
        self._set_stage("validate", value)

    @property
    def testing(self) -> bool:
        return self.state.stage == "test"

    @testing.setter
    def testing(self, value: bool) -> None:
        self._set_stage("test", value)

    @property
    def predicting(self) -> bool:
        return self.state.stage == "predict"

    @predicting.setter
    def predicting(self, value: bool) -> None:
        self._set_stage("predict", value)

    @property
    def sanity_checking(self) -> bool:
        return self.state.stage == "sanity_check"

    @sanity_checking.setter
    def sanity_checking(self, value: bool) -> None:
        self._set_stage("sanity_check", value)

    @property
    def evaluating(self) -> bool:
        return self.state.stage in ("validate", "test", "sanity_check")

    def _set_stage(self, stage: str, value: bool) -> None:
        if value:
            self.state.stage = stage
        elif self.state.stage == stage:
            self.state.stage = None

    def __getstate__(self) -> dict[str, Any]:
        # The module travels to workers as its own argument; the trainer never carries it.
        state = self.__dict__.copy()
        state.update(lightning_module=None, datamodule=None, optimizers=[], wrapped_optimizers=[],
                     lr_scheduler_configs=[], data=DataSources(), preemption_watch=None,  # a watch holds a store
                     prediction_run=None)  # the latest predictions stay where they were made
        return state


def _split_datamodule(loaders: Any, datamodule: Any) -> Any:
    """Lightning lets a DataModule be passed where the dataloaders go; tell them apart."""
    if datamodule is None and loaders is not None and is_datamodule(loaders):
        return loaders
    return datamodule


def _one_or_list(loaders: list[Any] | None) -> Any:
    if loaders is None:
        return None
    return loaders[0] if len(loaders) == 1 else loaders
