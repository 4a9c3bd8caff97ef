"""What every rank runs for one stage: attach, set up data and model, loop, tear down.

`run_stage` is the function `Trainer` hands to `strategy.launch`. Global rank 0 runs it in the
calling process, on the user's own objects (so they hold what ran, as under Lightning's `ddp`);
other ranks run it on copies in their workers. The order of the set-up hooks is
Lightning's: configure_callbacks, prepare_data, the loggers' experiments, setup (DataModule,
callbacks, module), configure_model, the checkpoint's weights, datamodule and callback states,
configure_optimizers, on_fit_start, then the checkpoint's training state (optimizers, schedulers,
loop position).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

import torch
from torch import nn

from strategies.checkpoint_io import CheckpointError, UntrustedCheckpointError
from strategies.rank_zero import rank_zero_warn
from trainer import checkpointing
from trainer.callbacks.dispatch import adopt_callback, checkpoints_last
from trainer.compiled import compiled_steps
from trainer.data_sources import overrides
from trainer.loops.evaluation import has_step, print_results, run_evaluation, run_predict
from trainer.loops.fit_loop import run_fit
from trainer.loops.metric_writes import write_logger_metrics
from trainer.loops.prediction_run import PredictionRun
from trainer.loops.resume import ResumePoint
from trainer.loops.preemption import default_resume_candidates, discard_if_consumed, preemption_checkpoint_path
from strategies.lightning_types import register_strategy_types
from trainer.module_adapter import align_lightning_rank, attach, automatic_optimization, check_module, unbind_api
from trainer.optimizers import ManualOptimizer, NoOptimizer, check_schedulers, init_optimizers
from trainer.profiler import is_profiling
from trainer.seed import reset_seed
from trainer.state import FitRun
from trainer.validation import apply_backend_flags, as_items

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_DATA_STAGE = {"validate": "validate", "test": "test", "predict": "predict"}
_RUNNING_STAGE = {"fit": "train", "validate": "validate", "test": "test", "predict": "predict"}


def run_stage(trainer: Trainer, stage: str, model: nn.Module, data: dict[str, Any]) -> Any:
    check_module(model, stage)
    if data.pop("launcher_pid", None) != os.getpid():  # a worker's copy: the caller's backend flags
        apply_backend_flags(trainer.deterministic, trainer.benchmark)
    if trainer.world_size > 1:
        reset_seed()  # on every rank, the launching process's too, as Lightning's DDP does
    trainer.lightning_module, trainer.datamodule = model, data.get("datamodule")
    if stage == "fit":  # before any hook may ask the fit to stop (Lightning resets should_stop here); is_last_batch
        # belongs to Lightning's epoch loop, which keeps it until the next batch runs
        trainer.fit_run = FitRun(is_last_batch=trainer.fit_run.is_last_batch)
    align_lightning_rank(trainer.global_rank)
    register_strategy_types()  # on every rank: a worker imports the program's Lightning when the stage arrives
    trainer.state.fn, trainer.state.stage = stage, _RUNNING_STAGE[stage]
    trainer.data.reset({"train": data.get("train_dataloaders"), "validate": data.get("val_dataloaders")}
                       if stage == "fit" else {_DATA_STAGE[stage]: data.get("dataloaders")})
    attach(model, trainer)
    if trainer.datamodule is not None:
        trainer.datamodule.trainer = trainer
    _add_module_callbacks(trainer, model)
    trainer.profiler.setup(stage=stage, local_rank=trainer.local_rank if trainer.world_size > 1 else None,
                           log_dir=trainer.log_dir if is_profiling(trainer.profiler) else None)
    try:
        return _run(trainer, stage, model, data)
    except KeyboardInterrupt as error:
        rank_zero_warn("Trainer stopped by KeyboardInterrupt (Ctrl-C); the model keeps the weights it had then.")
        _on_exception(trainer, model, error)
        raise
    except BaseException as error:
        _on_exception(trainer, model, error)
        raise
    finally:
        unbind_api(model)
        trainer.callback_list.take_back_logging()
        if trainer.datamodule is not None:
            trainer.datamodule.trainer = None
        trainer.state.stage = None
        _report_profile(trainer, stage)


def _report_profile(trainer: Trainer, stage: str) -> None:
    """The profiler's report for the stage, also when it failed (Lightning's teardown); a report that
    cannot be written warns instead of hiding how the stage ended."""
    try:
        trainer.profiler.describe()
    except Exception as error:  # noqa: BLE001 (any failure of a report must not replace the stage's outcome)
        rank_zero_warn(f"the profiler's report for {stage} could not be written: {error!r}")
    finally:
        trainer.profiler.teardown(stage)


def _on_exception(trainer: Trainer, model: nn.Module, error: BaseException) -> None:
    """Lightning's order when a stage ends by an exception: the callbacks' `on_exception`, then the
    datamodule's; the loggers close with status "failed"."""
    trainer.callback_list.call("on_exception", trainer, model, error)
    if trainer.datamodule is not None:
        trainer.callback_list.call_module("on_exception", trainer.datamodule, error)
    _finalize_loggers(trainer, "failed")


def _add_module_callbacks(trainer: Trainer, model: nn.Module) -> None:
    """`configure_callbacks()` of the module: each replaces the Trainer's callbacks of its type
    (Lightning's rule), the rest are added; checkpointing stays last."""
    extra = trainer.callback_list.call_module("configure_callbacks", model)
    if not extra:
        return
    extra = [adopt_callback(callback) for callback in as_items(extra)]
    replaced = {type(callback) for callback in extra}
    kept = [c for c in trainer.callback_list.callbacks if type(c) not in replaced and c not in extra]
    trainer.callback_list.callbacks[:] = checkpoints_last(kept + extra)


def _create_experiments(trainer: Trainer) -> None:
    """Each logger's experiment (its writer and run directory) exists before the setup hooks, as in
    Lightning, so they can read its metadata; on global rank 0, the rank that logs."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        if isinstance(getattr(type(logger), "experiment", None), property):
            _ = logger.experiment


def _run(trainer: Trainer, stage: str, model: nn.Module, data: dict[str, Any]) -> Any:
    callbacks, strategy = trainer.callback_list, trainer.strategy
    stage = trainer.state.fn or stage  # the same string, also answering `.value` as Lightning's enum does
    _prepare_data(trainer, model)
    _create_experiments(trainer)
    if trainer.datamodule is not None:
        trainer.datamodule.setup(stage=stage)
    callbacks.call("setup", trainer, model, stage=stage)
    callbacks.call_module("configure_model", model)
    module = strategy.setup_module(trainer.precision_plugin.convert_module(model), for_training=stage == "fit")
    trainer.lightning_module = module
    callbacks.lend_logging(module)
    with compiled_steps(strategy.unwrap(module), strategy):
        output = _run_entry(trainer, module, stage, data)
    if trainer.datamodule is not None:  # Lightning: the DataModule first, then callbacks, then the module
        trainer.datamodule.teardown(stage=stage)
    callbacks.call("teardown", trainer, module, stage=stage)
    return output


def _run_entry(trainer: Trainer, module: nn.Module, stage: str, data: dict[str, Any]) -> Any:
    ckpt = CheckpointRequest(data.get("ckpt_path"), weights_only=data.get("weights_only") is not False)
    if stage == "fit":
        return _fit(trainer, module, ckpt)
    if stage == "predict":
        trainer.ckpt_path = _restore_weights(trainer, module, ckpt)
        _log_hyperparams(trainer, module)
        module.zero_grad()
        loaders = trainer.data.request(trainer, "predict") if trainer.limit_predict_batches != 0 else []
        run = PredictionRun.start(loaders, trainer.callbacks, data.get("return_predictions") is not False)
        trainer.prediction_run = run  # what prediction writers read through trainer.predict_loop
        output = run_predict(trainer, module, run)
        _finalize_loggers(trainer, "success")
        return output
    return _evaluate(trainer, module, stage, ckpt, data.get("verbose", True))


@dataclass(frozen=True)
class CheckpointRequest:
    """The checkpoint a stage was asked to start from (`ckpt_path`: a file, "last", "best" or None) and
    whether its file may only hold weights and plain values (`weights_only=False`: the user trusts it)."""

    path: str | None
    weights_only: bool = True


def _fit(trainer: Trainer, module: nn.Module, ckpt: CheckpointRequest) -> None:
    """The fit stage; a preemption notice from here on stops it at a step boundary with a checkpoint. The
    watch stays on the trainer after the fit (its signals no longer caught), so hooks that run as the fit
    ends, `on_exception` included, and the user afterwards read `received_sigterm` as in Lightning."""
    with trainer.strategy.preemption_watch() as watch:
        trainer.fit_run.preemption_watch = watch
        _fit_watched(trainer, module, ckpt)


def _fit_watched(trainer: Trainer, module: nn.Module, ckpt: CheckpointRequest) -> None:
    checkpoint, path = _load_for_fit(trainer, module, ckpt)
    trainer.ckpt_path = path
    if checkpoint is not None and path is not None:
        checkpointing.restore_module(trainer.strategy.unwrap(module), checkpoint, path)
        checkpointing.restore_datamodule(trainer, checkpoint)
        checkpointing.restore_callbacks(trainer, module, checkpoint)
    # Lightning's point: the setup hooks and on_load_checkpoint still saw the last stage's metrics
    # (evaluation stages clear them when their loop starts)
    trainer.metric_store.clear_views()
    _configure_optimizers(trainer, module)
    callbacks = trainer.callback_list
    callbacks.call("on_fit_start", trainer, module)
    _log_hyperparams(trainer, module)  # every stage, after on_fit_start in fit (Lightning's order)
    resume = ResumePoint()  # a fit without a checkpoint goes on from the Trainer's progress
    if checkpoint is not None and path is not None:
        # Lightning's order: after on_fit_start, so a callback that changes the optimizer there (BaseFinetuning
        # adds back the parameter groups it had unfrozen) gets the saved state into the optimizer it rebuilt
        resume = checkpointing.restore_training_state(trainer, module, checkpoint, path)
    module.zero_grad()
    with torch.autograd.set_detect_anomaly(trainer.detect_anomaly):
        run_fit(trainer, module, resume)
    trainer.strategy.finish_checkpoints()  # a background write's error is the fit's, before on_fit_end
    callbacks.call("on_fit_end", trainer, module)
    discard_if_consumed(trainer)
    _finalize_loggers(trainer, "success")


def _evaluate(trainer: Trainer, module: nn.Module, stage: str, ckpt: CheckpointRequest,
              verbose: bool) -> list[dict[str, float]]:
    if not has_step(module, stage):
        step = "validation_step" if stage == "validate" else "test_step"
        raise NotImplementedError(f"Trainer.{stage}() needs {type(module).__name__}.{step}(batch, batch_idx).")
    trainer.ckpt_path = _restore_weights(trainer, module, ckpt)
    _log_hyperparams(trainer, module)
    module.zero_grad()
    limit = trainer.limit_val_batches if stage == "validate" else trainer.limit_test_batches
    loaders = trainer.data.request(trainer, stage) if limit != 0 else []
    results = run_evaluation(trainer, module, loaders, stage)
    _finalize_loggers(trainer, "success")
    if verbose and results and any(results) and trainer.is_global_zero:
        print_results(stage, results)
    return results


# ---------------------------------------------------------------------- data
def _prepare_data(trainer: Trainer, module: nn.Module) -> None:
    """`prepare_data` once per node (local rank 0) while the other ranks wait."""
    datamodule = trainer.datamodule
    if trainer.local_rank == 0:
        for owner in (datamodule, module):
            prepare = getattr(owner, "prepare_data", None)
            if callable(prepare):
                with trainer.strategy.local_work(f"{type(owner).__name__}.prepare_data()"):
                    prepare()  # a download may take minutes while the other ranks wait
    trainer.strategy.barrier("prepare_data")


# ---------------------------------------------------------------------- optimizers and checkpoints
def _configure_optimizers(trainer: Trainer, module: nn.Module) -> None:
    returned = trainer.callback_list.call_module("configure_optimizers", module)
    optimizers, schedulers = init_optimizers(returned)
    automatic = automatic_optimization(module)
    if automatic and len(optimizers) > 1:
        raise ValueError(f"configure_optimizers() returned {len(optimizers)} optimizers; automatic optimization "
                         "uses one. Set `self.automatic_optimization = False` and step them yourself.")
    if automatic and not optimizers:
        if returned is not None:
            raise ValueError("configure_optimizers() returned no optimizer; automatic optimization needs one.")
        warnings.warn(f"{type(module).__name__}.configure_optimizers() returned None: this fit runs training_step "
                      "and backward but updates nothing.", UserWarning, stacklevel=2)
        optimizers = [NoOptimizer()]
    check_schedulers(optimizers, schedulers, module, automatic, overrides(module, "lr_scheduler_step"))
    trainer.strategy.setup_optimizers(optimizers, loss_scaling=trainer.precision_plugin.scaler is not None)
    trainer.optimizers, trainer.lr_scheduler_configs = optimizers, schedulers
    trainer.wrapped_optimizers = [ManualOptimizer(optimizer, trainer) for optimizer in optimizers]


def _checkpoint_dirs(trainer: Trainer) -> list[str]:
    dirs = [getattr(cb, "dirpath", None) or os.path.join(trainer.log_dir, "checkpoints")
            for cb in trainer.checkpoint_callbacks]
    return [d for d in dirs if d]


def _load_for_fit(trainer: Trainer, module: nn.Module,
                  ckpt: CheckpointRequest) -> tuple[dict[str, Any] | None, str | None]:
    """The checkpoint `fit` resumes from: a path, "last" (newest readable one), "best", or None; None
    in a directory holding a preemption checkpoint means the newest checkpoint of this run there."""
    ckpt_path = ckpt.path
    automatic = ckpt_path is None and (ckpt_path := default_resume_candidates(trainer)) is not None
    if ckpt_path is None and trainer.strategy.restart_count > 0:
        ckpt_path = "last"  # an elastic restart resumes from the newest checkpoint by itself
    if ckpt_path == "best":
        ckpt_path = _best_path(trainer)
    also = [preemption_checkpoint_path(trainer)] if ckpt_path == "last" else []
    for path in checkpointing.resolve_ckpt_path(ckpt_path, _checkpoint_dirs(trainer), also=also):
        try:
            checkpoint = _load(trainer, path, ckpt.weights_only)
        except CheckpointError as error:
            if ckpt_path != "last" or isinstance(error, UntrustedCheckpointError):
                raise
            warnings.warn(f"ckpt_path='last': skipping unreadable {path}: {error}", stacklevel=2)
            continue
        if automatic and not checkpointing.same_run(trainer.strategy.unwrap(module), checkpoint, path):
            trainer.fit_run.resumed_after_preemption = False
            return None, None
        return checkpoint, path
    if ckpt_path == "last":
        warnings.warn(f"ckpt_path='last' found no readable checkpoint in {_checkpoint_dirs(trainer)}; training "
                      "starts from scratch.", stacklevel=2)
    return None, None


def _best_path(trainer: Trainer) -> str:
    callback = trainer.checkpoint_callback
    path = getattr(callback, "best_model_path", None) or None
    if not path:
        raise CheckpointError("ckpt_path='best' but no best checkpoint is known: fit with a ModelCheckpoint first "
                              "(with a `monitor`, or it keeps the last one), or pass a checkpoint file.")
    return path


def _restore_weights(trainer: Trainer, module: nn.Module, ckpt: CheckpointRequest) -> str | None:
    """Load the weights `validate`/`test`/`predict` were asked to use, then the module's and the
    callbacks' `on_load_checkpoint` and the callbacks' states, as Lightning does; returns the file."""
    if ckpt.path is None:
        return None
    if ckpt.path == "best":
        paths = [_best_path(trainer)]
    else:
        paths = checkpointing.resolve_ckpt_path(ckpt.path, _checkpoint_dirs(trainer))
    if not paths:
        return None
    checkpoint = _load(trainer, paths[0], ckpt.weights_only)
    checkpointing.restore_module(trainer.strategy.unwrap(module), checkpoint, paths[0])
    checkpointing.restore_callbacks(trainer, module, checkpoint)
    return paths[0]


def _load(trainer: Trainer, path: str, weights_only: bool) -> dict[str, Any]:
    checkpoint = trainer.strategy.load_checkpoint(path, weights_only=weights_only)
    checkpointing.check_checkpoint(checkpoint, path)
    return checkpoint


# ---------------------------------------------------------------------- reporting
def _log_hyperparams(trainer: Trainer, module: nn.Module) -> None:
    """As each stage starts, every logger gets the hyperparameters (unless turned off) and the model
    for its graph (`log_graph`; TensorBoardLogger(log_graph=True) draws it), as in Lightning."""
    if not trainer.is_global_zero:
        return
    log_params = trainer.enable_autolog_hparams and getattr(module, "_log_hyperparams", True)
    hparams = dict(getattr(module, "hparams", {}) or {})
    if trainer.datamodule is not None:
        hparams.update(dict(getattr(trainer.datamodule, "hparams", {}) or {}))
    for logger in trainer.loggers:
        if log_params:
            logger.log_hyperparams(hparams)
        if callable(getattr(logger, "log_graph", None)):
            logger.log_graph(module)
        if callable(getattr(logger, "save", None)):
            logger.save()


def _finalize_loggers(trainer: Trainer, status: str) -> None:
    if trainer.is_global_zero:
        write_logger_metrics(trainer)
        for logger in trainer.loggers:
            logger.finalize(status)
