"""What the calling process does around one stage: settle the model and the checkpoint to use, hand
`run_stage` to the strategy (which runs it here as global rank 0, and on copies in the other ranks'
workers), and record how the stage ended on the Trainer the user holds."""

from __future__ import annotations

import os
from typing import Any, TYPE_CHECKING

from torch import nn

from strategies.rank_zero import rank_zero_warn
from trainer.checkpointing import require_checkpoint_file
from trainer.compiled import unwrap_compiled
from trainer.data_sources import is_datamodule
from trainer.run import run_stage

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def launch(trainer: Trainer, stage: str, model: nn.Module | None, data: dict[str, Any]) -> Any:
    """Run `stage` on every rank and return rank 0's output; the inputs are checked here, before any
    worker starts, so a typo costs nothing."""
    model = _stage_model(trainer, stage, model)
    if data.get("weights_only") not in (None, True, False):
        raise TypeError(f"weights_only={data['weights_only']!r} must be None, True or False.")
    require_checkpoint_file(data.get("ckpt_path"))
    if data.get("datamodule") is None:
        data["datamodule"] = trainer.datamodule if model is trainer.lightning_module else None
    for logger in trainer.loggers:
        _ = logger.version  # decided here, once, so every worker writes to the same directory
    data = {**data, "launcher_pid": os.getpid()}
    trainer.state.status = "running"
    try:
        output = trainer.strategy.launch(run_stage, trainer, stage, model, data)
    except KeyboardInterrupt:  # Ctrl-C: after the graceful shutdown the script ends, as under Lightning
        _stage_ended(trainer, stage, model, "interrupted")
        raise SystemExit(1) from None
    except BaseException:
        trainer.state.status = "interrupted"
        raise
    _stage_ended(trainer, stage, model, "finished")
    return output


def _stage_model(trainer: Trainer, stage: str, model: nn.Module | None) -> nn.Module:
    """The module given (a compiled one: its original, Lightning's meaning), else the one attached last."""
    model = unwrap_compiled(model) if model is not None else None
    if model is None:
        model = trainer.lightning_module
    elif stage != "fit" and trainer.lightning_module is not None and model is not trainer.lightning_module:
        trainer._fitted = False
    if model is None:
        raise TypeError(f"Trainer.{stage}() needs a model: pass one, or call fit(model) first.")
    return model


def _stage_ended(trainer: Trainer, stage: str, model: nn.Module, status: str) -> None:
    trainer.lightning_module = model
    trainer._fitted = trainer._fitted or stage == "fit"
    trainer.state.status = status
    trainer.state.fn, trainer.state.stage = stage, None


def default_ckpt_path(trainer: Trainer, stage: str, model: nn.Module | None, ckpt_path: str | None) -> str | None:
    """Lightning's rule: after a fit, evaluating without a model and without `ckpt_path` uses the
    best checkpoint of that fit; say so, since the weights are not the ones the fit ended with."""
    best = getattr(trainer.checkpoint_callback, "best_model_path", None)
    if model is not None or ckpt_path is not None or not trainer._fitted or not best:
        return ckpt_path
    rank_zero_warn(f"{stage}() was called without a model after fit(): it uses the best checkpoint of that fit "
                   f"({best}), not the weights the fit ended with. Pass ckpt_path='best', 'last', a file, or the "
                   "model itself to choose (and silence this).")
    return "best"


def split_datamodule(loaders: Any, datamodule: Any) -> Any:
    """Lightning lets a DataModule be passed where the dataloaders go; tell them apart."""
    if datamodule is None and loaders is not None and is_datamodule(loaders):
        return loaders
    return datamodule
