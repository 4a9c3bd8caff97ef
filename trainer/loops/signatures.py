"""Step and batch-hook signatures checked before a stage runs, so a mismatch with what the loop
passes fails at once with the fix, instead of as a TypeError deep inside the first batch.

* Automatic optimization steps one optimizer: a `training_step` that still takes Lightning 1.x's
  `optimizer_idx` is refused.
* With one evaluation dataloader no `dataloader_idx` is passed: a step or batch hook that
  requires one (no default value) is refused.
"""

from __future__ import annotations

import inspect
from typing import Any

from trainer.data_sources import overrides

_EVAL_PREFIX = {"validate": "validation", "test": "test", "predict": "predict"}


def check_training_signature(module: Any) -> None:
    if not getattr(module, "automatic_optimization", True):
        return
    if "optimizer_idx" in _parameters(getattr(module, "training_step", None)):
        raise RuntimeError(f"{type(module).__name__}.training_step() takes `optimizer_idx`, which is not passed: "
                           "automatic optimization steps one optimizer. Remove the argument; to step several "
                           "optimizers set `self.automatic_optimization = False` and call them in training_step.")


def check_eval_signatures(module: Any, stage: str, num_dataloaders: int) -> None:
    if num_dataloaders != 1:
        return
    prefix = _EVAL_PREFIX[stage]
    for name in (f"{prefix}_step", f"on_{prefix}_batch_start", f"on_{prefix}_batch_end"):
        if not overrides(module, name):
            continue
        parameter = _parameters(getattr(module, name)).get("dataloader_idx")
        if parameter is not None and parameter.default is inspect.Parameter.empty:
            raise RuntimeError(f"{type(module).__name__}.{name}() requires `dataloader_idx`, but there is only one "
                               f"{prefix} dataloader, so none is passed. Give it a default (`dataloader_idx=0`) "
                               "or remove it.")


def _parameters(function: Any) -> dict[str, inspect.Parameter]:
    if not callable(function):
        return {}
    try:
        return dict(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return {}
