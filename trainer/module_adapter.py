"""Attach a module to our Trainer, including an unchanged `pytorch_lightning.LightningModule`.

Lightning's own module routes `self.log`, `self.optimizers()` and `self.manual_backward` into
its trainer's private connectors. For such a module we bind our implementations of exactly
those methods on the instance for the duration of a run, and remove them afterwards (so the
module pickles and behaves as before). Our own `LightningModule` needs none of this.

`manual_backward` stays the module's own (its class's: Lightning's or the user's override; or a callable the
user set on the instance, such as a wrapper that records calls, which is kept and put back afterwards): it
checks manual optimization with Lightning's exception and ends in `self.trainer.strategy.backward(loss,
None, ...)`, expecting the strategy to run the trainer's side of a backward (precision scaling,
`on_before_backward`/`on_after_backward`). Our strategies only run the pass and its gradient sync, so
while that method runs the module's `trainer` is a `_BackwardRouting` view of ours, whose
`strategy.backward` is the Trainer's backward, the one automatic optimization uses.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from torch import nn

from trainer import module as module_api
from trainer.backward import backward
from trainer.stage import Stage, StageOwner
from trainer.module import LightningModule

_LIGHTNING_RANK_MODULE = "lightning_utilities.core.rank_zero"  # shared by both Lightning packages

# Methods of Lightning's module that reach into its trainer's internals; ours replace them.
_BOUND_API: dict[str, Callable[..., Any]] = {
    "log": module_api.log,
    "log_dict": module_api.log_dict,
    "optimizers": module_api.optimizers,
    "lr_schedulers": module_api.lr_schedulers,
    "clip_gradients": module_api.clip_gradients,
    "toggle_optimizer": module_api.toggle_optimizer,
    "untoggle_optimizer": module_api.untoggle_optimizer,
}


def check_module(module: Any, stage: str = "fit") -> None:
    """Fail early, naming what is missing, if `module` cannot run `stage` in our Trainer."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"Trainer.{stage} expects a LightningModule, got {type(module).__name__}.")
    if stage != "fit":
        return
    missing = [name for name in ("training_step", "configure_optimizers") if not callable(getattr(module, name, None))]
    if missing:
        raise TypeError(f"{type(module).__name__} cannot be trained: it has no {' or '.join(missing)}(). "
                        "Subclass trainer.LightningModule and implement them.")


def attach(module: nn.Module, trainer: StageOwner) -> None:
    """Give the module (and nested Lightning modules) a reference to the trainer."""
    for child in module.modules():
        if child is module or _looks_like_lightning_module(child):
            _attach_one(child, trainer)


def unbind_api(module: nn.Module) -> None:
    """Take back the API methods a stage bound on a module of another class (Lightning's own), so the
    module is its class's again afterwards; it stays attached (`module.trainer`), as under Lightning."""
    for child in module.modules():
        for name in child.__dict__.pop("_bound_by_trainer", ()):
            child.__dict__.pop(name, None)
        if "_manual_backward_of_user" in child.__dict__:
            users = child.__dict__.pop("_manual_backward_of_user")
            child.__dict__.pop("manual_backward", None)
            if users is not None:
                child.__dict__["manual_backward"] = users


def _attach_one(module: nn.Module, trainer: StageOwner) -> None:
    module.__dict__["_trainer"] = trainer
    module.__dict__.setdefault("_current_fx_name", None)
    if isinstance(module, LightningModule):
        return
    for name, function in _BOUND_API.items():
        if name not in module.__dict__:  # an attribute the user set on the instance stays theirs
            module.__dict__[name] = types.MethodType(function, module)
            module.__dict__.setdefault("_bound_by_trainer", set()).add(name)
    if "_manual_backward_of_user" not in module.__dict__:
        # The user's own instance attribute (a wrapper of Lightning's method) is kept, and run routed as well.
        module.__dict__["_manual_backward_of_user"] = module.__dict__.get("manual_backward")
        module.__dict__["manual_backward"] = types.MethodType(_manual_backward, module)


def _manual_backward(module: nn.Module, loss: Any, *args: Any, **kwargs: Any) -> None:
    """A Lightning module's own `manual_backward` (the instance's own attribute if the user set one, else its
    class's: Lightning's, or the user's override), run with `self.trainer` routing the backward it asks of
    the strategy to our Trainer's."""
    trainer = module.__dict__["_trainer"]
    if isinstance(trainer, _BackwardRouting):  # a user's wrapper calling the method it wraps: routed already
        type(module).manual_backward(module, loss, *args, **kwargs)  # type: ignore[attr-defined]
        return
    trained = trainer.lightning_module if trainer.lightning_module is not None else module
    users = module.__dict__.get("_manual_backward_of_user")
    module.__dict__["_trainer"] = _BackwardRouting(trainer, trained)
    try:
        if users is not None:
            users(loss, *args, **kwargs)
        else:
            type(module).manual_backward(module, loss, *args, **kwargs)  # type: ignore[attr-defined]
    finally:
        module.__dict__["_trainer"] = trainer


class _BackwardRouting:
    """Our Trainer as Lightning's `manual_backward` reaches it: every attribute is the Trainer's, except
    that `strategy.backward(loss, optimizer, *args, **kwargs)` runs the Trainer's backward (precision
    scaling, the backward hooks, the strategy's synchronised pass) for the module being trained."""

    def __init__(self, trainer: StageOwner, trained: nn.Module) -> None:
        self._routed = trainer
        self.strategy = _StrategyBackward(trainer, trained)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._routed, name)


class _StrategyBackward:
    def __init__(self, trainer: StageOwner, trained: nn.Module) -> None:
        self._trainer, self._trained = trainer, trained

    def backward(self, loss: Any, optimizer: Any = None, *args: Any, **kwargs: Any) -> None:
        # Lightning's `manual_backward` reaches us through `self.trainer.strategy` alone: the Stage of that Trainer
        backward(Stage.of(self._trainer), self._trained, loss, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer.strategy, name)


def _looks_like_lightning_module(module: nn.Module) -> bool:
    return callable(getattr(module, "training_step", None)) and hasattr(module, "_trainer")


def set_current_hook(module: nn.Module, fx: str | None) -> str | None:
    """Record which hook runs, so `self.log` follows that hook's rule; returns the hook that ran
    before, which the caller puts back when this one returns (hooks nest: a manual
    `training_step` runs `on_before_backward` and logs again after it)."""
    previous = module.__dict__.get("_current_fx_name")
    module.__dict__["_current_fx_name"] = fx
    return previous


def automatic_optimization(module: nn.Module) -> bool:
    return bool(getattr(module, "automatic_optimization", True))


def align_lightning_rank(rank: int) -> None:
    """Lightning's own objects (its loggers' `experiment`, `rank_zero_only` functions, its callbacks'
    messages) ask a module-level rank whether they run on rank 0; Lightning reads it from the
    environment once, at import, which in a worker can happen before the rank is known. Set it to
    this process's rank whenever a Lightning package is loaded (nothing is imported here)."""
    module = sys.modules.get(_LIGHTNING_RANK_MODULE)
    if module is not None:
        module.rank_zero_only.rank = rank  # type: ignore[attr-defined]
