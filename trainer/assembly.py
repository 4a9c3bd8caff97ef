"""The parts a Trainer is built from its arguments: the strategy, the loggers, the callbacks.

Each takes the arguments as `resolve_trainer_args` returned them (checked, Lightning's defaults
filled in, `barebones` and `fast_dev_run` applied), so the Trainer's constructor stays a list of
what it holds.
"""

from __future__ import annotations

from typing import Any

from strategies import Strategy, resolve_strategy
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.callbacks.model_summary import ModelSummary
from trainer.callbacks.progress import TQDMProgressBar
from trainer.callbacks.telemetry import TelemetryMonitor
from trainer.checkpoint_plugins import async_checkpoint_from_plugins
from trainer.callbacks.dispatch import (CallbackList, adopt_callback, checkpoints_last, is_checkpoint,
                                       is_model_summary, is_progress_bar)
from trainer.loggers.base import DummyLogger, is_logger
from trainer.loggers.tensorboard import TensorBoardLogger
from trainer.profiler import is_profiling
from trainer.validation import as_items


def build_strategy(args: dict[str, Any]) -> Strategy:
    """The strategy named or given, configured for the accelerator, devices and nodes asked for (and
    for background checkpoint writes when `plugins` holds Lightning's AsyncCheckpointIO)."""
    async_checkpoint = async_checkpoint_from_plugins(args["plugins"])
    strategy = resolve_strategy(args["strategy"], args["num_devices"], args["num_nodes"],
                                sync_batchnorm=args["sync_batchnorm"])
    if async_checkpoint:
        strategy.async_checkpoint = True
    accelerator = args["accelerator"]
    strategy.configure(accelerator=None if accelerator == "auto" else accelerator, devices=args["num_devices"],
                       num_nodes=args["num_nodes"])
    return strategy


def build_loggers(args: dict[str, Any]) -> list[Any]:
    """`logger`: True (TensorBoard in default_root_dir), False/None, one logger or a list of them."""
    logger = args["logger"]
    if args["barebones"] or logger is None or logger is False:
        return []
    if args["fast_dev_run"]:
        return [DummyLogger()]  # Lightning: a fast_dev_run writes no logs, but trainer.logger still works
    if logger is True:
        return [TensorBoardLogger(save_dir=args["default_root_dir"])]
    loggers = as_items(logger)
    for item in loggers:
        if not is_logger(item):
            raise TypeError(f"logger must be a Logger (ours or Lightning's), a list of them, True or False; "
                            f"got {type(item).__name__}.")
    return loggers


def build_callbacks(args: dict[str, Any], profiler: Any) -> CallbackList:
    """The user's callbacks, then (Lightning's order) the progress bar, the model summary and the
    checkpoint callback the flags ask for, and our telemetry; checkpointing runs last."""
    given = as_items(args["callbacks"]) if args["callbacks"] is not None else []
    result = [adopt_callback(callback) for callback in given]
    telemetry, fast_dev_run, checkpointing = args["enable_telemetry"], args["fast_dev_run"], args["enable_checkpointing"]
    if not isinstance(telemetry, bool):
        raise TypeError(f"enable_telemetry must be True or False, got {telemetry!r}.")
    if args["enable_progress_bar"] and not any(is_progress_bar(c) for c in result):
        result.append(TQDMProgressBar())
    if args["enable_model_summary"] and not any(is_model_summary(c) for c in result):
        result.append(ModelSummary())
    if telemetry and not args["barebones"] and not fast_dev_run \
            and not any(isinstance(c, TelemetryMonitor) for c in result):
        result.append(TelemetryMonitor(log_to_loggers=False))  # the loggers get only what the user logs
    if not checkpointing and any(is_checkpoint(c) for c in result):
        raise ValueError("Trainer(enable_checkpointing=False) (or barebones=True) contradicts the ModelCheckpoint "
                         "in callbacks: remove the callback, or enable checkpointing.")
    if checkpointing and not fast_dev_run and not any(is_checkpoint(c) for c in result):
        result.append(ModelCheckpoint())
    return CallbackList(checkpoints_last(result), profiler=profiler if is_profiling(profiler) else None)

