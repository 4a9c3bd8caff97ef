"""Trainer: Lightning's arguments and entry points; the loops live in trainer/loops/.

`fit`/`validate`/`test`/`predict` hand one function, `run_stage`, to `strategy.launch`, which
runs it here as global rank 0 (and on copies in the other ranks' workers), so after any stage
the module, callbacks, loggers and this Trainer are the objects that ran, exactly as with a
single process or Lightning's `ddp`.
"""

from __future__ import annotations

import contextlib
import operator
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, TYPE_CHECKING

import torch
from torch import nn

from strategies import Strategy
from strategies.lightning_types import register_strategy_types
from trainer.assembly import build_callbacks, build_loggers, build_strategy
from trainer.callbacks.dispatch import is_early_stopping, is_progress_bar
from trainer.checkpointing import build_checkpoint
from trainer.contract import TrainerContract
from trainer.logged_metrics import MetricStore
from trainer.data_sources import DataSources
from trainer.lightning_views import FitLoopView, LoggerConnectorView, PredictLoopView
from trainer.optimizers import LRSchedulerConfig
from trainer.profiler import resolve_profiler
from trainer.precision import Precision
from trainer.prediction_run import PredictionRun
from trainer.schedule import settled_max_epochs, stepping_batches, validation_every
from trainer.stage import Stage
from trainer.launch import launch, split_datamodule, stage_request
from trainer.state import FitProgress, FitRun, TrainerStatus
from trainer.validation import apply_backend_flags, defaults_from_env, resolve_trainer_args

# Arguments the Trainer turns into the objects it holds (the strategy, loggers, callbacks, profiler)
# rather than keeping as attributes of the same name.
_BUILT_FROM = ("accelerator", "strategy", "devices", "logger", "callbacks", "profiler", "plugins", "sync_batchnorm",
               "enable_checkpointing", "enable_progress_bar", "enable_telemetry", "model_registry")


def _read_only(path: str) -> property:
    """A read-only Trainer attribute answered by one of its parts (`"strategy.global_rank"`)."""
    read = operator.attrgetter(path)
    return property(lambda trainer: read(trainer))


def _stage_flag(stage: str) -> property:
    """A Lightning stage flag (`trainer.training`, ...): whether `stage` is the loop running now."""

    def get(trainer: Trainer) -> bool:
        return trainer.state.stage == stage

    def set_(trainer: Trainer, value: bool) -> None:
        if value:
            trainer.state.stage = stage
        elif trainer.state.stage == stage:
            trainer.state.stage = None

    return property(get, set_)


class Trainer:
    """Runs Lightning-style training with a pluggable `Strategy` (see docs/trainer-contract.md).

    The arguments are Lightning 2.6's, keyword-only, with its defaults; `None` means "Lightning's
    default" where Lightning uses `None` that way. Beyond Lightning: `enable_telemetry` and
    `on_nonfinite`."""

    # The arguments kept as `resolve_trainer_args` settled them (the rest build the strategy, loggers and
    # callbacks: _BUILT_FROM); loops and callbacks read them, and may change a limit between stages.
    barebones: bool
    default_root_dir: str
    num_devices: int
    num_nodes: int
    precision: str
    fast_dev_run: bool | int
    max_epochs: int | None
    min_epochs: int | None
    max_steps: int
    min_steps: int | None
    max_time: timedelta | None
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    overfit_batches: int | float
    val_check_interval: int | float
    check_val_every_n_epoch: int | None
    num_sanity_val_steps: int
    log_every_n_steps: int
    enable_model_summary: bool
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: str | None
    deterministic: bool | str | None
    benchmark: bool | None
    inference_mode: bool
    use_distributed_sampler: bool
    detect_anomaly: bool
    reload_dataloaders_every_n_epochs: int
    enable_autolog_hparams: bool
    on_nonfinite: str

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
        max_epochs: int | None = None, min_epochs: int | None = None,
        max_steps: int = -1, min_steps: int | None = None,
        max_time: Any = None,
        limit_train_batches: int | float | None = None, limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None, limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        val_check_interval: int | float | None = None, check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        log_every_n_steps: int | None = None,
        enable_checkpointing: bool | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None,
        deterministic: bool | str | None = None, benchmark: bool | None = None,
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
        args = resolve_trainer_args(locals())  # checked; Lightning's None, barebones and fast_dev_run applied
        vars(self).update({name: value for name, value in args.items() if name not in _BUILT_FROM})
        apply_backend_flags(deterministic, benchmark)
        self.strategy = build_strategy(args)
        register_strategy_types()  # isinstance(trainer.strategy, Lightning's strategy types), once Lightning is imported
        self.loggers = build_loggers(args)
        self.profiler = resolve_profiler(profiler)
        self.callback_list = build_callbacks(args, self.profiler)
        self.state, self.progress, self.fit_run = TrainerStatus(), FitProgress(), FitRun()
        self.metric_store = MetricStore(self.strategy.reduce, ranks=self.strategy)
        self.precision_plugin = Precision(self.precision, self.strategy.root_device.type)
        self.data = DataSources()
        self._detach_stage_objects()
        self.ckpt_path: str | os.PathLike[str] | None = None  # the checkpoint the latest stage started from
        self._fitted = False  # a fit ran on the current model: evaluating it without one may use "best"

    def _detach_stage_objects(self) -> None:
        """What a stage attaches (the module and its data, optimizers, the latest predict run): none yet, and
        none in a copy sent to another process (the module travels as its own argument)."""
        self.lightning_module: nn.Module | None = None
        self.datamodule: Any = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.wrapped_optimizers: list[Any] = []
        self.lr_scheduler_configs: list[LRSchedulerConfig] = []
        self.prediction_run: PredictionRun | None = None  # the latest predict run, for prediction writers

    # ------------------------------------------------------------------ entry points
    def fit(self, model: nn.Module, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: Any = None, ckpt_path: str | os.PathLike[str] | None = None,
            weights_only: bool | None = None) -> None:
        """Train `model`; afterwards it holds the trained weights (also after multi-process runs).
        `weights_only=False` trusts `ckpt_path`: any pickled object in it is rebuilt (Lightning's meaning)."""
        self.max_epochs = settled_max_epochs(self)  # here: the launching process's attribute and warning are the fit's
        train_dataloaders, datamodule = split_datamodule(train_dataloaders, datamodule)
        loaders = {"train": train_dataloaders, "validate": val_dataloaders}
        launch(self, stage_request(self, "fit", model, loaders, datamodule, ckpt_path, weights_only))

    def validate(self, model: nn.Module | None = None, dataloaders: Any = None,
                 ckpt_path: str | os.PathLike[str] | None = None, verbose: bool = True, datamodule: Any = None,
                 weights_only: bool | None = None) -> list[dict[str, float]]:
        return self._evaluate_entry("validate", model, dataloaders, ckpt_path, verbose, datamodule, weights_only)

    def test(self, model: nn.Module | None = None, dataloaders: Any = None,
             ckpt_path: str | os.PathLike[str] | None = None, verbose: bool = True, datamodule: Any = None,
             weights_only: bool | None = None) -> list[dict[str, float]]:
        return self._evaluate_entry("test", model, dataloaders, ckpt_path, verbose, datamodule, weights_only)

    def predict(self, model: nn.Module | None = None, dataloaders: Any = None, datamodule: Any = None,
                return_predictions: bool | None = None, ckpt_path: str | os.PathLike[str] | None = None,
                weights_only: bool | None = None) -> Any:
        dataloaders, datamodule = split_datamodule(dataloaders, datamodule)
        output = launch(self, stage_request(self, "predict", model, {"predict": dataloaders}, datamodule, ckpt_path,
                                            weights_only, return_predictions=return_predictions))
        return output if return_predictions is not False else None

    def _evaluate_entry(self, stage: str, model: nn.Module | None, dataloaders: Any,
                        ckpt_path: str | os.PathLike[str] | None, verbose: bool, datamodule: Any,
                        weights_only: bool | None) -> list[dict[str, float]]:
        dataloaders, datamodule = split_datamodule(dataloaders, datamodule)
        return launch(self, stage_request(self, stage, model, {stage: dataloaders}, datamodule, ckpt_path,
                                          weights_only, verbose=verbose))

    # ------------------------------------------------------------------ used by loops and callbacks
    def save_checkpoint(self, filepath: str | os.PathLike[str], weights_only: bool = False,
                        storage_options: Any = None, *, background: bool = False) -> None:
        """Collective: every rank calls it; global rank 0 writes atomically; all wait. It returns with the
        file complete, as Lightning's; `background=True` (ours) returns once the state is copied and writes
        the file on a thread (what `async_checkpoint=True` does for ModelCheckpoint): a failed write raises
        at the next step or at fit end."""
        if self.lightning_module is None:
            raise RuntimeError("save_checkpoint() needs a model attached: call it during or after fit().")
        if storage_options is not None:
            raise TypeError("save_checkpoint(storage_options=...) is not supported: our checkpoint I/O writes local "
                            "files; pass a CheckpointIO to the strategy to write elsewhere.")
        self.fit_run.nonfinite_watch.check(self.strategy)  # never save weights a non-finite step has already spoiled
        with self.profiler.profile("save_checkpoint"):
            module = self.strategy.unwrap(self.lightning_module)
            checkpoint = build_checkpoint(Stage.of(self), module, weights_only)  # callbacks hand us the Trainer
            if background:
                self.strategy.save_checkpoint(checkpoint, filepath, background=True)
            else:  # a strategy written before `background` existed takes (checkpoint, path)
                self.strategy.save_checkpoint(checkpoint, filepath)

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
    # Answered by the part that owns each value (progress, the strategy, the metric store, the data).
    global_step = _read_only("progress.global_step")
    current_epoch = _read_only("progress.current_epoch")
    is_last_batch = _read_only("fit_run.is_last_batch")
    global_rank = _read_only("strategy.global_rank")
    local_rank = _read_only("strategy.local_rank")
    node_rank = _read_only("strategy.node_rank")
    world_size = _read_only("strategy.world_size")
    is_global_zero = _read_only("strategy.is_global_zero")
    callbacks = _read_only("callback_list.callbacks")
    callback_metrics = _read_only("metric_store.callback_metrics")
    logged_metrics = _read_only("metric_store.logged_metrics")
    progress_bar_metrics = _read_only("metric_store.progress_bar_metrics")
    num_training_batches = _read_only("data.counts.train")
    num_sanity_val_batches = _read_only("data.counts.sanity_val")
    num_test_batches = _read_only("data.counts.test")
    num_predict_batches = _read_only("data.counts.predict")
    # The step metrics are logged at: the batches that stepped before the current one (Lightning's count).
    logger_step = _read_only("progress.stepped_batches")
    # The module the strategy trains (Lightning: the wrapped model; ours is the module, its reducer attached).
    model = _read_only("lightning_module")

    @property
    def should_stop(self) -> bool:
        return self.fit_run.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.fit_run.should_stop = bool(value)

    @property
    def received_sigterm(self) -> bool:
        """Lightning's flag: in the latest fit, this rank received SIGTERM or learned that the ranks stop for
        one (a preemption notice, trainer/loops/preemption.py; SIGTERM among the strategy's preemption
        signals). Every rank sees it True by the agreed stop; the next fit starts it afresh."""
        watch = self.fit_run.preemption_watch
        return watch is not None and "SIGTERM" in (watch.flag.received, watch.agreement.signal_name)

    @property
    def interrupted(self) -> bool:
        return self.state.status == "interrupted"

    @property
    def predict_loop(self) -> PredictLoopView:
        """What prediction writers read of the current (or latest) predict run (see trainer/prediction_run.py)."""
        return PredictLoopView(self.prediction_run)

    @property
    def fit_loop(self) -> FitLoopView:
        """Read-only: what Lightning's own callbacks read of Lightning's fit loop (trainer/lightning_views.py)."""
        return FitLoopView(self)

    @property
    def _logger_connector(self) -> LoggerConnectorView:
        return LoggerConnectorView(self)

    @property
    def device_ids(self) -> list[int]:
        return list(range(self.num_devices))

    @property
    def accelerator(self) -> str:
        return self.strategy.root_device.type

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
        """Validation batches per dataloader: `validate()`'s during validate, else fit's."""
        return self.data.counts.val_of(self.state.fn)

    @property
    def enable_validation(self) -> bool:
        return self.data.validates(self.datamodule, self.lightning_module, self.limit_val_batches)

    train_dataloader = _read_only("data.train_dataloader")
    val_dataloaders = _read_only("data.val_dataloaders")
    test_dataloaders = _read_only("data.test_dataloaders")
    predict_dataloaders = _read_only("data.predict_dataloaders")

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps this fit will take (Lightning's estimate, also inside configure_optimizers,
        which requests the training loader early to count it, as Lightning does)."""
        per_epoch = self.num_training_batches
        if per_epoch == float("inf") and self.state.fn == "fit" and self.lightning_module is not None:
            per_epoch = self.data.count_training_batches(Stage.of(self).loader_source(), self.limit_train_batches)
        return stepping_batches(self, per_epoch)

    # Lightning's stage flags: which loop runs now (trainer.state.stage); setting one True starts it.
    training = _stage_flag("train")
    validating = _stage_flag("validate")
    testing = _stage_flag("test")
    predicting = _stage_flag("predict")
    sanity_checking = _stage_flag("sanity_check")

    @property
    def evaluating(self) -> bool:
        return self.state.stage in ("validate", "test", "sanity_check")

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process: its settings, state and batch counts, without what a stage attached."""
        copy = Trainer.__new__(Trainer)
        copy.__dict__.update(self.__dict__)
        copy._detach_stage_objects()
        copy.data = DataSources()
        copy.data.counts = self.data.counts
        return copy.__dict__


if TYPE_CHECKING:  # mypy: the Trainer keeps its contract (trainer/contract.py, what callbacks are typed against)
    def _trainer_keeps_the_contract(trainer: Trainer) -> TrainerContract:
        return trainer
