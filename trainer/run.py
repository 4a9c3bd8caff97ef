"""What every worker runs for one stage: attach, set up data and model, loop, tear down.

`run_stage` is the function `Trainer` hands to `strategy.launch`; it returns global rank 0's
`StageResult` so the launching process can adopt the outcome.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import nn

from strategies.checkpoint_io import CheckpointError
from trainer import checkpointing
from trainer.loops.evaluation import has_step, run_evaluation, run_predict
from trainer.loops.fit_loop import run_fit
from trainer.module_adapter import attach, automatic_optimization, check_module, detach
from trainer.callbacks.dispatch import checkpoints_last
from trainer.optimizers import ManualOptimizer, init_optimizers
from trainer.seed import SEED_ENV, seed_everything

_STAGE_NAMES = {"fit": "fit", "validate": "validate", "test": "test", "predict": "predict"}
_LOADER_HOOKS = {"fit": "train_dataloader", "validate": "val_dataloader", "test": "test_dataloader",
                 "predict": "predict_dataloader"}


def run_stage(trainer: Any, stage: str, model: nn.Module, data: dict[str, Any]) -> Any:
    from trainer.trainer import StageResult

    check_module(model)
    launcher_pid = data.pop("launcher_pid", None)
    if launcher_pid != os.getpid():
        _reseed_worker()
    trainer.lightning_module, trainer.datamodule = model, data.get("datamodule")
    trainer.state.fn = stage
    attach(model, trainer)
    if trainer.datamodule is not None:
        trainer.datamodule.trainer = trainer
    if trainer.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    extra = model.configure_callbacks() if callable(getattr(model, "configure_callbacks", None)) else []
    callbacks = trainer.callback_list.callbacks
    callbacks[:] = checkpoints_last(callbacks + [c for c in extra or [] if c not in callbacks])
    try:
        output = _run(trainer, stage, model, data)
    except BaseException as error:
        trainer.callback_list.call("on_exception", trainer, model, error)
        _finalize_loggers(trainer, "failed")
        raise
    finally:
        detach(model)
        if trainer.datamodule is not None:
            trainer.datamodule.trainer = None
        trainer.state.stage = None
    result = StageResult(pid=os.getpid(), output=output, loop_state=trainer.loop_state.state_dict(),
                         callback_states=trainer.callback_list.state_dict(),
                         callback_metrics=dict(trainer.callback_metrics),
                         logged_metrics=dict(trainer.logged_metrics),
                         progress_bar_metrics=dict(trainer.progress_bar_metrics))
    if launcher_pid != os.getpid():
        result.state_dict = {k: v.detach().cpu() for k, v in trainer.strategy.unwrap(model).state_dict().items()}
    return result


def _reseed_worker() -> None:
    """A spawned worker starts with fresh RNGs: give it the seed the user set in the launching
    process (as Lightning does), so dropout and shuffling are reproducible run to run."""
    if SEED_ENV in os.environ:
        seed_everything(int(os.environ[SEED_ENV]), workers=os.environ.get("PL_SEED_WORKERS") == "1")


def _run(trainer: Any, stage: str, model: nn.Module, data: dict[str, Any]) -> Any:
    callbacks, strategy = trainer.callback_list, trainer.strategy
    _prepare_data(trainer, model, stage)
    callbacks.call("setup", trainer, model, stage=stage)
    module = strategy.setup_module(trainer.precision_plugin.convert_module(model))
    trainer.lightning_module = module
    if stage == "fit":
        output = _fit(trainer, module, data)
    elif stage == "predict":
        loaders = _loaders(trainer, module, stage, data.get("dataloaders"))
        _restore_weights(trainer, module, data.get("ckpt_path"))
        trainer.state.stage = "predict"
        output = run_predict(trainer, module, loaders)
    else:
        output = _evaluate(trainer, module, stage, data)
    callbacks.call("teardown", trainer, module, stage=stage)
    if trainer.datamodule is not None:
        trainer.datamodule.teardown(stage)
    return output


def _fit(trainer: Any, module: nn.Module, data: dict[str, Any]) -> None:
    train_loader = _single_loader(_loaders(trainer, module, "fit", data.get("train_dataloaders")))
    val_loaders = _loaders(trainer, module, "validate", data.get("val_dataloaders"), required=False)
    _configure_optimizers(trainer, module)
    _restore_for_fit(trainer, module, data.get("ckpt_path"))
    _log_hyperparams(trainer, module)
    _print_summary(trainer, module)
    callbacks = trainer.callback_list
    callbacks.call("on_fit_start", trainer, module)
    trainer.state.stage = "train"
    run_fit(trainer, module, train_loader, val_loaders)
    callbacks.call("on_fit_end", trainer, module)
    _finalize_loggers(trainer, "success")


def _evaluate(trainer: Any, module: nn.Module, stage: str, data: dict[str, Any]) -> list[dict[str, float]]:
    if not has_step(module, stage):
        step = "validation_step" if stage == "validate" else "test_step"
        raise NotImplementedError(f"Trainer.{stage}() needs {type(module).__name__}.{step}(batch, batch_idx).")
    loaders = _loaders(trainer, module, stage, data.get("dataloaders"))
    _restore_weights(trainer, module, data.get("ckpt_path"))
    trainer.state.stage = stage
    trainer.num_val_batches = [len(loader) for loader in loaders if hasattr(loader, "__len__")]
    results = run_evaluation(trainer, module, loaders, stage)
    _finalize_loggers(trainer, "success")
    if results and results[0] and trainer.is_global_zero and stage == "test":
        trainer.print(f"{stage} results: " + ", ".join(f"{k}={v:.4f}" for k, v in results[0].items()))
    return results


# ---------------------------------------------------------------------- data
def _prepare_data(trainer: Any, module: nn.Module, stage: str) -> None:
    """`prepare_data` once per node (local rank 0), then `setup(stage)` on every rank."""
    datamodule = trainer.datamodule
    if trainer.local_rank == 0:
        for owner in (datamodule, module):
            if owner is not None and callable(getattr(owner, "prepare_data", None)):
                with trainer.strategy.local_work(f"{type(owner).__name__}.prepare_data()"):
                    owner.prepare_data()  # a download may take minutes while the other ranks wait
    trainer.strategy.barrier("prepare_data")
    if datamodule is not None:
        datamodule.setup(stage)


def _loaders(trainer: Any, module: nn.Module, stage: str, given: Any, required: bool = True) -> list[Any]:
    hook = _LOADER_HOOKS[stage]
    loaders = given if given is not None else _from_hooks(trainer, module, hook)
    if loaders is None:
        if required:
            raise ValueError(f"Trainer.{stage}() found no data: pass dataloaders, a datamodule with {hook}(), "
                             f"or implement {hook}() on the module.")
        return []
    loaders = list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]
    if trainer.use_distributed_sampler:
        loaders = [trainer.strategy.process_dataloader(loader, for_training=stage == "fit") for loader in loaders]
    return loaders


def _from_hooks(trainer: Any, module: nn.Module, hook: str) -> Any:
    for owner in (trainer.datamodule, module):
        if owner is not None and _overrides(owner, hook):
            return getattr(owner, hook)()
    return None


def _overrides(owner: Any, hook: str) -> bool:
    """True when `owner` implements `hook` itself rather than inheriting a base class's default."""
    method = getattr(type(owner), hook, None)
    if method is None:
        return False
    defined_in = method.__qualname__.split(".")[0]
    return defined_in not in ("LightningDataModule", "LightningModule", "DataHooks")


def _single_loader(loaders: list[Any]) -> Any:
    if len(loaders) != 1:
        raise ValueError(f"fit() takes one training dataloader; got {len(loaders)}.")
    return loaders[0]


# ---------------------------------------------------------------------- optimizers and checkpoints
def _configure_optimizers(trainer: Any, module: nn.Module) -> None:
    optimizers, schedulers = init_optimizers(trainer.callback_list.call_module("configure_optimizers", module))
    if automatic_optimization(module) and len(optimizers) > 1:
        raise ValueError(f"configure_optimizers() returned {len(optimizers)} optimizers; automatic optimization "
                         "uses one. Set `self.automatic_optimization = False` and step them yourself.")
    if automatic_optimization(module) and not optimizers:
        raise ValueError("configure_optimizers() returned no optimizer; automatic optimization needs one.")
    trainer.optimizers, trainer.lr_scheduler_configs = optimizers, schedulers
    trainer.wrapped_optimizers = [ManualOptimizer(optimizer, trainer) for optimizer in optimizers]
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)


def _restore_for_fit(trainer: Any, module: nn.Module, ckpt_path: str | None) -> None:
    if ckpt_path is None and trainer.strategy.restart_count > 0:
        ckpt_path = "last"  # an elastic restart resumes from the newest checkpoint by itself
    dirs = [cb.dirpath or os.path.join(trainer.log_dir, "checkpoints") for cb in trainer.checkpoint_callbacks]
    for path in checkpointing.resolve_ckpt_path(ckpt_path, [d for d in dirs if d]):
        try:
            checkpoint = _load(trainer, path)
        except CheckpointError as error:
            if ckpt_path != "last":
                raise
            warnings.warn(f"ckpt_path='last': skipping unreadable {path}: {error}", stacklevel=2)
            continue
        checkpointing.restore_module(trainer.strategy.unwrap(module), checkpoint, path)
        checkpointing.restore_training_state(trainer, module, checkpoint, path)
        return
    if ckpt_path == "last":
        warnings.warn(f"ckpt_path='last' found no readable checkpoint in {dirs}; training starts from scratch.",
                      stacklevel=2)


def _restore_weights(trainer: Any, module: nn.Module, ckpt_path: str | None) -> None:
    if ckpt_path is None:
        return
    if ckpt_path == "best":
        callback = trainer.checkpoint_callback
        ckpt_path = getattr(callback, "best_model_path", None) or None
        if not ckpt_path:
            raise CheckpointError("ckpt_path='best' but no best checkpoint is known; fit with a ModelCheckpoint first.")
    else:
        paths = checkpointing.resolve_ckpt_path(ckpt_path, [cb.dirpath for cb in trainer.checkpoint_callbacks
                                                             if cb.dirpath])
        ckpt_path = paths[0] if paths else None
    if ckpt_path is not None:
        checkpointing.restore_module(trainer.strategy.unwrap(module), _load(trainer, ckpt_path), ckpt_path)


def _load(trainer: Any, path: str) -> dict[str, Any]:
    checkpoint = trainer.strategy.load_checkpoint(path)
    checkpointing.check_checkpoint(checkpoint, path)
    return checkpoint


# ---------------------------------------------------------------------- reporting
def _log_hyperparams(trainer: Any, module: nn.Module) -> None:
    if not trainer.is_global_zero or not getattr(module, "_log_hyperparams", True):
        return
    hparams = dict(getattr(module, "hparams", {}) or {})
    if trainer.datamodule is not None:
        hparams.update(dict(getattr(trainer.datamodule, "hparams", {}) or {}))
    for logger in trainer.loggers:
        logger.log_hyperparams(hparams)


def _print_summary(trainer: Any, module: nn.Module) -> None:
    if not (trainer.enable_model_summary and trainer.is_global_zero):
        return
    params = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    trainer.print(f"{type(module).__name__}: {params:,} parameters ({trainable:,} trainable) | "
                  f"{type(trainer.strategy).__name__} world_size={trainer.world_size} | precision {trainer.precision}")


def _finalize_loggers(trainer: Any, status: str) -> None:
    if trainer.is_global_zero:
        trainer.write_logger_metrics()
        for logger in trainer.loggers:
            logger.finalize(status)
