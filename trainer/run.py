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
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from strategies.rank_zero import rank_zero_warn
from trainer import checkpointing
from trainer.checkpoint_choice import (CheckpointRequest, ChosenCheckpoint, choose_checkpoint,
                                       discard_preemption_checkpoint)
from trainer.compiled import compiled_steps
from trainer.data_sources import overrides
from trainer.loops.evaluation import has_step, print_results, run_evaluation, run_predict
from trainer.loops.fit_loop import run_fit
from trainer.loops.metric_writes import write_logger_metrics
from trainer.prediction_run import PredictionRun
from trainer.loops.resume import ResumePoint
from strategies.lightning_types import register_strategy_types
from trainer.module_adapter import align_lightning_rank, attach, automatic_optimization, check_module, unbind_api
from trainer.optimizers import ManualOptimizer, settle_optimizers
from trainer.profiler import is_profiling
from trainer.restart_point import put_back_for_restart
from trainer.seed import reset_seed
from trainer.stage import Stage, StageOwner
from trainer.stage_request import StageRequest
from trainer.state import FitRun
from trainer.validation import apply_backend_flags, as_items

if TYPE_CHECKING:
    from trainer.callbacks.dispatch import CallbackList


class StageRunner(StageOwner, Protocol):
    """What running a stage does to the Trainer, beyond what its Stage reads: it attaches the module, the
    datamodule, the optimizers and the checkpoint it started from, and starts the fit's or the predict run's
    record. The Trainer satisfies it (mypy checks `strategy.launch(run_stage, ...)` in trainer/trainer.py), so
    this module needs no import of trainer.trainer."""

    lightning_module: nn.Module | None
    datamodule: Any
    fit_run: FitRun
    prediction_run: PredictionRun | None
    ckpt_path: str | os.PathLike[str] | None
    optimizers: list[Any]
    lr_scheduler_configs: list[Any]
    wrapped_optimizers: list[Any]

    @property
    def callback_list(self) -> CallbackList: ...
    @property
    def deterministic(self) -> Any: ...
    @property
    def benchmark(self) -> bool | None: ...
    @property
    def enable_autolog_hparams(self) -> bool: ...

_RUNNING_STAGE = {"fit": "train", "validate": "validate", "test": "test", "predict": "predict"}


def run_stage(trainer: StageRunner, request: StageRequest) -> Any:
    stage, model = request.stage, request.model
    check_module(model, stage)
    put_back_for_restart(trainer, model, request.datamodule)  # a restarted fit: as it began
    if not request.in_launching_process:  # a worker's copy: the caller's backend flags
        apply_backend_flags(trainer.deterministic, trainer.benchmark)
    if trainer.world_size > 1:
        reset_seed()  # on every rank, the launching process's too, as Lightning's DDP does
    trainer.lightning_module, trainer.datamodule = model, request.datamodule
    if stage == "fit":  # before any hook may ask the fit to stop (Lightning resets should_stop here); is_last_batch
        # belongs to Lightning's epoch loop, which keeps it until the next batch runs
        trainer.fit_run = FitRun(is_last_batch=trainer.fit_run.is_last_batch)
    align_lightning_rank(trainer.global_rank)
    register_strategy_types()  # on every rank: a worker imports the program's Lightning when the stage arrives
    trainer.state.fn, trainer.state.stage = stage, _RUNNING_STAGE[stage]
    trainer.data.reset(request.loaders)
    attach(model, trainer)
    if trainer.datamodule is not None:
        trainer.datamodule.trainer = trainer
    _add_module_callbacks(trainer, model)
    trainer.profiler.setup(stage=stage, local_rank=trainer.local_rank if trainer.world_size > 1 else None,
                           log_dir=trainer.log_dir if is_profiling(trainer.profiler) else None)
    try:
        return _run(trainer, model, request)
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


def _report_profile(trainer: StageRunner, stage: str) -> None:
    """The profiler's report for the stage, also when it failed (Lightning's teardown); a report that
    cannot be written warns instead of hiding how the stage ended."""
    try:
        trainer.profiler.describe()
    except Exception as error:  # noqa: BLE001 (any failure of a report must not replace the stage's outcome)
        rank_zero_warn(f"the profiler's report for {stage} could not be written: {error!r}")
    finally:
        trainer.profiler.teardown(stage)


def _on_exception(trainer: StageRunner, model: nn.Module, error: BaseException) -> None:
    """Lightning's order when a stage ends by an exception: the callbacks' `on_exception`, then the
    datamodule's; the loggers close with status "failed"."""
    trainer.callback_list.call("on_exception", trainer, model, error)
    if trainer.datamodule is not None:
        trainer.callback_list.call_module("on_exception", trainer.datamodule, error)
    _finalize_loggers(Stage.of(trainer), "failed")  # the stage may have failed before its Stage was built


def _add_module_callbacks(trainer: StageRunner, model: nn.Module) -> None:
    extra = trainer.callback_list.call_module("configure_callbacks", model)
    if extra:
        trainer.callback_list.add_module_callbacks(as_items(extra))


def _create_experiments(trainer: StageRunner) -> None:
    """Each logger's experiment (its writer and run directory) exists before the setup hooks, as in
    Lightning, so they can read its metadata; on global rank 0, the rank that logs."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        if isinstance(getattr(type(logger), "experiment", None), property):
            _ = logger.experiment


def _run(trainer: StageRunner, model: nn.Module, request: StageRequest) -> Any:
    callbacks, strategy = trainer.callback_list, trainer.strategy
    stage = trainer.state.fn or request.stage  # the same string, also answering `.value` as Lightning's enum does
    _prepare_data(trainer, model)
    _create_experiments(trainer)
    if trainer.datamodule is not None:
        trainer.datamodule.setup(stage=stage)
    callbacks.call("setup", trainer, model, stage=stage)
    callbacks.call_module("configure_model", model)
    module = strategy.setup_module(trainer.precision_plugin.convert_module(model), for_training=stage == "fit")
    trainer.lightning_module = module
    callbacks.lend_logging(module)
    parts = Stage.of(trainer)  # the stage's one Stage: its parts are not replaced while it runs
    with compiled_steps(strategy.unwrap(module), strategy):
        output = _run_entry(trainer, parts, module, stage, request)
    if trainer.datamodule is not None:  # Lightning: the DataModule first, then callbacks, then the module
        trainer.datamodule.teardown(stage=stage)
    callbacks.call("teardown", trainer, module, stage=stage)
    return output


def _run_entry(trainer: StageRunner, parts: Stage, module: nn.Module, stage: str, request: StageRequest) -> Any:
    if stage == "fit":
        return _fit(trainer, parts, module, request.checkpoint)
    if stage == "predict":
        _start_from_checkpoint(trainer, parts, module, stage, request.checkpoint)
        _log_hyperparams(trainer, module)
        module.zero_grad()
        loaders = parts.data.request("predict", parts.loader_source()) if parts.live.limit_predict_batches != 0 else []
        run = PredictionRun.start(loaders, trainer.callbacks, request.return_predictions is not False)
        trainer.prediction_run = run  # what prediction writers read through trainer.predict_loop
        output = run_predict(parts, module, run)
        _finalize_loggers(parts, "success")
        return output
    return _evaluate(trainer, parts, module, stage, request.checkpoint, request.verbose)


def _start_from_checkpoint(trainer: StageRunner, parts: Stage, module: nn.Module, stage: str,
                           request: CheckpointRequest) -> ChosenCheckpoint:
    """The checkpoint the stage starts from (trainer/checkpoint_choice.py chooses it), its weights put back,
    then the module's and the callbacks' `on_load_checkpoint` and the callbacks' states (fit: the
    datamodule's state too), as Lightning does."""
    chosen = choose_checkpoint(trainer, stage, module, request)
    trainer.ckpt_path = chosen.path
    if stage == "fit":
        parts.fit_run.resumed_after_preemption = chosen.resumes_preempted_run
    if chosen.contents is None or chosen.path is None:
        return chosen
    checkpointing.restore_module(parts.strategy.unwrap(module), chosen.contents, chosen.path)
    if stage == "fit":
        checkpointing.restore_datamodule(parts, chosen.contents)
    checkpointing.restore_callbacks(parts, module, chosen.contents)
    return chosen


def _fit(trainer: StageRunner, parts: Stage, module: nn.Module, ckpt: CheckpointRequest) -> None:
    """The fit stage; a preemption notice from here on stops it at a step boundary with a checkpoint. The
    watch stays on the trainer after the fit (its signals no longer caught), so hooks that run as the fit
    ends, `on_exception` included, and the user afterwards read `received_sigterm` as in Lightning."""
    with parts.strategy.preemption_watch() as watch:
        parts.fit_run.preemption_watch = watch
        _fit_watched(trainer, parts, module, ckpt)


def _fit_watched(trainer: StageRunner, parts: Stage, module: nn.Module, ckpt: CheckpointRequest) -> None:
    chosen = _start_from_checkpoint(trainer, parts, module, "fit", ckpt)
    # Lightning's point: the setup hooks and on_load_checkpoint still saw the last stage's metrics
    # (evaluation stages clear them when their loop starts)
    parts.metrics.clear_views()
    _configure_optimizers(trainer, parts, module)
    callbacks = parts.callbacks
    callbacks.call("on_fit_start", trainer, module)
    _log_hyperparams(trainer, module)  # every stage, after on_fit_start in fit (Lightning's order)
    resume = ResumePoint()  # a fit without a checkpoint goes on from the Trainer's progress
    if chosen.contents is not None and chosen.path is not None:
        # Lightning's order: after on_fit_start, so a callback that changes the optimizer there (BaseFinetuning
        # adds back the parameter groups it had unfrozen) gets the saved state into the optimizer it rebuilt
        saved = checkpointing.restore_training_state(parts, chosen.contents, chosen.path)
        resume = ResumePoint.restored(parts.progress, saved.loader_states, saved.rng_states)
    module.zero_grad()
    with torch.autograd.set_detect_anomaly(parts.fixed.detect_anomaly):
        run_fit(parts, module, resume)
    parts.strategy.finish_checkpoints()  # a background write's error is the fit's, before on_fit_end
    callbacks.call("on_fit_end", trainer, module)
    if parts.fit_run.resumed_after_preemption:  # the preempted run is complete: a later fit starts afresh
        discard_preemption_checkpoint(trainer)
        parts.fit_run.resumed_after_preemption = False
    _finalize_loggers(parts, "success")


def _evaluate(trainer: StageRunner, parts: Stage, module: nn.Module, stage: str, ckpt: CheckpointRequest,
              verbose: bool) -> list[dict[str, float]]:
    if not has_step(module, stage):
        step = "validation_step" if stage == "validate" else "test_step"
        raise NotImplementedError(f"Trainer.{stage}() needs {type(module).__name__}.{step}(batch, batch_idx).")
    _start_from_checkpoint(trainer, parts, module, stage, ckpt)
    _log_hyperparams(trainer, module)
    module.zero_grad()
    limit = parts.live.limit_val_batches if stage == "validate" else parts.live.limit_test_batches
    loaders = parts.data.request(stage, parts.loader_source()) if limit != 0 else []
    results = run_evaluation(parts, module, loaders, stage)
    _finalize_loggers(parts, "success")
    if verbose and results and any(results) and trainer.is_global_zero:
        print_results(stage, results)
    return results


# ---------------------------------------------------------------------- data
def _prepare_data(trainer: StageRunner, module: nn.Module) -> None:
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
def _configure_optimizers(trainer: StageRunner, parts: Stage, module: nn.Module) -> None:
    returned = parts.callbacks.call_module("configure_optimizers", module)
    optimizers, schedulers = settle_optimizers(returned, module, automatic=automatic_optimization(module),
                                               custom_scheduler_step=overrides(module, "lr_scheduler_step"))
    parts.strategy.setup_optimizers(optimizers, loss_scaling=parts.precision.scaler is not None)
    trainer.optimizers, trainer.lr_scheduler_configs = optimizers, schedulers
    trainer.wrapped_optimizers = [ManualOptimizer(optimizer, parts) for optimizer in optimizers]


# ---------------------------------------------------------------------- reporting
def _log_hyperparams(trainer: StageRunner, module: nn.Module) -> None:
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


def _finalize_loggers(parts: Stage, status: str) -> None:
    if parts.strategy.is_global_zero:
        write_logger_metrics(parts)
        for logger in parts.loggers:
            logger.finalize(status)
