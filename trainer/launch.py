"""What the calling process does around one stage: settle the request (the model, its data and the checkpoint
to use: one `StageRequest`), hand `run_stage` to the strategy (which runs it here as global rank 0, and on
copies in the other ranks' workers), and record how the stage ended on the Trainer the user holds."""

from __future__ import annotations

import os
from typing import Any, TYPE_CHECKING

from torch import nn

from trainer.checkpoint_choice import requested_checkpoint
from trainer.compiled import unwrap_compiled
from trainer.data_sources import is_datamodule
from trainer.restart_point import remembered_for_restarts
from trainer.run import StageRunner, run_stage
from trainer.stage_request import StageRequest

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def stage_request(trainer: Trainer, stage: str, model: nn.Module | None, loaders: dict[str, Any], datamodule: Any,
                  ckpt_path: str | os.PathLike[str] | None, weights_only: bool | None, *, verbose: bool = True,
                  return_predictions: bool | None = None) -> StageRequest:
    """The request an entry point hands to `launch`, checked here, before any worker starts, so a typo
    costs nothing: the module (the one given, else the one attached last), its datamodule, the checkpoint."""
    resolved = _stage_model(trainer, stage, model)
    checkpoint = requested_checkpoint(trainer, stage, model_given=model is not None, fitted=trainer._fitted,
                                      ckpt_path=ckpt_path, weights_only=weights_only)
    if datamodule is None and resolved is trainer.lightning_module:
        datamodule = trainer.datamodule
    return StageRequest(stage, resolved, loaders, datamodule, checkpoint, verbose=verbose,
                        return_predictions=return_predictions)


def launch(trainer: Trainer, request: StageRequest) -> Any:
    """Run the requested stage on every rank and return rank 0's output."""
    previous = trainer.lightning_module
    if request.stage != "fit" and previous is not None and previous is not request.model:
        trainer._fitted = False  # another model: "best" no longer means the fit's best checkpoint for it
    for logger in trainer.loggers:
        _ = logger.version  # decided here, once, so every worker writes to the same directory
    trainer.state.status = "running"
    try:
        runner: StageRunner = trainer  # what run_stage may do to it: mypy checks the Trainer satisfies it
        with remembered_for_restarts(trainer, request.stage, request.model, request.datamodule):
            output = trainer.strategy.launch(run_stage, runner, request)
    except KeyboardInterrupt:  # Ctrl-C: after the graceful shutdown the script ends, as under Lightning
        _stage_ended(trainer, request, "interrupted")
        raise SystemExit(1) from None
    except BaseException:
        trainer.state.status = "interrupted"
        raise
    _stage_ended(trainer, request, "finished")
    return output


def _stage_model(trainer: Trainer, stage: str, model: nn.Module | None) -> nn.Module:
    """The module given (a compiled one: its original, Lightning's meaning), else the one attached last."""
    model = unwrap_compiled(model) if model is not None else trainer.lightning_module
    if model is None:
        raise TypeError(f"Trainer.{stage}() needs a model: pass one, or call fit(model) first.")
    return model


def _stage_ended(trainer: Trainer, request: StageRequest, status: str) -> None:
    trainer.lightning_module = request.model
    trainer._fitted = trainer._fitted or request.stage == "fit"
    trainer.state.status = status
    trainer.state.fn, trainer.state.stage = request.stage, None


def split_datamodule(loaders: Any, datamodule: Any) -> tuple[Any, Any]:
    """Lightning lets a DataModule be passed where the dataloaders go; tell them apart: (loaders, datamodule)."""
    if datamodule is None and loaders is not None and is_datamodule(loaders):
        return None, loaders
    return loaders, datamodule
