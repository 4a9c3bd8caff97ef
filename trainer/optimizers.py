"""Normalise every `configure_optimizers` return form of Lightning into optimizers + schedulers."""

from __future__ import annotations

import collections
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.stage import Stage

_COMPARED = ("scheduler", "interval", "frequency", "monitor", "name", "strict", "reduce_on_plateau")
_SCHEDULER_KEYS = {"scheduler", "interval", "frequency", "monitor", "name", "strict", "reduce_on_plateau"}


@dataclass(eq=False)
class LRSchedulerConfig:
    """A scheduler and when to step it (Lightning's lr_scheduler dict, as a type)."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None
    strict: bool = True
    given_keys: list[str] = field(default_factory=list, repr=False, compare=False)  # the settings configure_optimizers named

    @property
    def reduce_on_plateau(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def __eq__(self, other: object) -> bool:
        """Equal to another scheduler config, ours or Lightning's, with the same settings."""
        if type(other).__name__ != "LRSchedulerConfig":
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name, None) for name in _COMPARED)


def init_optimizers(returned: Any) -> tuple[list[torch.optim.Optimizer], list[LRSchedulerConfig]]:
    """Accept: an optimizer; a list of optimizers; ([optimizers], [schedulers]); a dict with
    "optimizer" and optional "lr_scheduler" (scheduler or dict) and "monitor"; a list of dicts;
    or None (manual optimization without optimizers)."""
    if returned is None:
        return [], []
    if isinstance(returned, torch.optim.Optimizer):
        return [returned], []
    if isinstance(returned, Mapping):
        return _from_dicts([returned])
    if isinstance(returned, Sequence) and not isinstance(returned, str):
        items = list(returned)
        if len(items) == 2 and all(isinstance(x, Sequence) for x in items):
            optimizers = _check_optimizers(items[0])
            return optimizers, [_scheduler_config(s, None) for s in items[1]]
        if items and all(isinstance(x, Mapping) for x in items):
            return _from_dicts(items)
        return _check_optimizers(items), []
    raise TypeError(
        f"configure_optimizers() returned a {type(returned).__name__}; expected an optimizer, a list of "
        "optimizers, ([optimizers], [schedulers]), a dict with an 'optimizer' key, or a list of such dicts."
    )


def _from_dicts(dicts: list[Mapping[str, Any]]) -> tuple[list[torch.optim.Optimizer], list[LRSchedulerConfig]]:
    optimizers, schedulers = [], []
    for entry in dicts:
        if "optimizer" not in entry:
            raise KeyError(f"configure_optimizers() returned a dict without 'optimizer': keys {sorted(entry)}.")
        optimizers.extend(_check_optimizers([entry["optimizer"]]))
        if entry.get("lr_scheduler") is not None:
            schedulers.append(_scheduler_config(entry["lr_scheduler"], entry.get("monitor")))
    return optimizers, schedulers


def _check_optimizers(items: Sequence[Any]) -> list[torch.optim.Optimizer]:
    for item in items:
        if not isinstance(item, torch.optim.Optimizer):
            raise TypeError(f"configure_optimizers() returned {item!r} where a torch.optim.Optimizer was expected.")
    return list(items)


def _scheduler_config(scheduler: Any, monitor: str | None) -> LRSchedulerConfig:
    if isinstance(scheduler, Mapping):
        unknown = set(scheduler) - _SCHEDULER_KEYS
        if unknown:  # Lightning ignores them too, with a warning (a typo'd key must not pass silently)
            warnings.warn(f"lr_scheduler dict keys {sorted(unknown)} are not used; the known keys are "
                          f"{sorted(_SCHEDULER_KEYS)}.", RuntimeWarning)
        if "scheduler" not in scheduler:
            raise KeyError("lr_scheduler dict must contain the key 'scheduler'.")
        fields = {k: v for k, v in scheduler.items() if k in _SCHEDULER_KEYS and k != "reduce_on_plateau"}
        config = LRSchedulerConfig(**{"monitor": monitor, **fields})
    else:
        config = LRSchedulerConfig(scheduler=scheduler, monitor=monitor)
    if config.interval not in ("epoch", "step"):
        raise ValueError(f"lr_scheduler interval={config.interval!r}; expected 'epoch' or 'step'.")
    config.given_keys = sorted(set(scheduler) - {"scheduler"}) if isinstance(scheduler, Mapping) else []
    if monitor is not None:
        config.given_keys = sorted({*config.given_keys, "monitor"})
    return config


def settle_optimizers(returned: Any, module: Any, *, automatic: bool,
                      custom_scheduler_step: bool) -> tuple[list[torch.optim.Optimizer], list[LRSchedulerConfig]]:
    """What `configure_optimizers()` returned, checked for the module's optimization mode: automatic
    optimization steps one optimizer (None: a fit that updates nothing, with a warning, as Lightning), and
    every scheduler must be one the loop (or the module's `lr_scheduler_step`) can step and checkpoint."""
    optimizers, schedulers = init_optimizers(returned)
    if automatic and len(optimizers) > 1:
        raise ValueError(f"configure_optimizers() returned {len(optimizers)} optimizers; automatic optimization "
                         "uses one. Set `self.automatic_optimization = False` and step them yourself.")
    if automatic and not optimizers:
        if returned is not None:
            raise ValueError("configure_optimizers() returned no optimizer; automatic optimization needs one.")
        warnings.warn(f"{type(module).__name__}.configure_optimizers() returned None: this fit runs training_step "
                      "and backward but updates nothing.", UserWarning, stacklevel=3)
        optimizers = [NoOptimizer()]
    check_schedulers(optimizers, schedulers, module, automatic, custom_scheduler_step)
    return optimizers, schedulers


def check_schedulers(optimizers: list[Any], configs: list[LRSchedulerConfig], module: Any, automatic: bool,
                     custom_step: bool) -> None:
    """What the loop will do with each scheduler must be possible: it belongs to a returned
    optimizer, can be checkpointed, and (in automatic optimization, where the loop steps it) is a
    torch scheduler or the module steps it itself in `lr_scheduler_step`; a ReduceLROnPlateau
    the loop steps needs the metric to read. In manual optimization the user steps schedulers, so
    the stepping keys are ignored (with a warning)."""
    for config in configs:
        scheduler, name = config.scheduler, type(config.scheduler).__name__
        owner = getattr(scheduler, "optimizer", None)
        if owner is not None and not any(owner is optimizer for optimizer in optimizers):
            raise ValueError(f"configure_optimizers(): the {name} scheduler belongs to an optimizer that was not "
                             "returned; return that optimizer too, or build the scheduler on a returned one.")
        if not (callable(getattr(scheduler, "state_dict", None)) and callable(getattr(scheduler, "load_state_dict",
                                                                                          None))):
            raise TypeError(f"configure_optimizers(): the {name} scheduler has no state_dict()/load_state_dict(), so "
                            "it cannot be checkpointed; give it both.")
        if not automatic:
            ignored = [key for key in config.given_keys if key not in ("name",)]
            if ignored:
                warnings.warn(f"lr_scheduler settings {ignored} of {name} have no effect in manual optimization: "
                              "call scheduler.step() yourself in training_step or an epoch hook.", RuntimeWarning)
            continue
        if not isinstance(scheduler, (torch.optim.lr_scheduler.LRScheduler,
                                      torch.optim.lr_scheduler.ReduceLROnPlateau)) and not custom_step:
            raise TypeError(f"configure_optimizers(): {name} is not a torch.optim.lr_scheduler scheduler, so the loop "
                            f"cannot step it; override {type(module).__name__}.lr_scheduler_step(scheduler, metric) "
                            "to step it yourself.")
        if config.reduce_on_plateau and config.monitor is None:
            raise KeyError("ReduceLROnPlateau needs a metric: return {'optimizer': ..., 'lr_scheduler': ..., "
                           "'monitor': 'val_loss'} from configure_optimizers().")


class NoOptimizer(torch.optim.Optimizer):
    """What automatic optimization steps when `configure_optimizers` returns None (Lightning runs
    such a fit too, with a warning): the closure (training_step, backward) runs, nothing is updated."""

    def __init__(self) -> None:  # no parameters: torch's constructor would refuse an empty list
        self.param_groups: list[dict[str, Any]] = []
        self.state = collections.defaultdict(dict)
        self.defaults: dict[str, Any] = {}
        self._optimizer_step_pre_hooks: dict[int, Any] = {}
        self._optimizer_step_post_hooks: dict[int, Any] = {}

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"state": {}, "param_groups": []}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class ManualOptimizer:
    """What `self.optimizers()` returns: `.step()` goes through the precision plugin (loss
    scaling) and counts into `trainer.global_step`, as Lightning's LightningOptimizer does."""

    def __init__(self, optimizer: torch.optim.Optimizer, parts: Stage) -> None:
        # Present as a subclass of the wrapped optimizer's class so `isinstance(opt, SGD)` and
        # `isinstance(opt, Optimizer)` hold in user code; state lives on the wrapped object.
        self.__dict__["optimizer"] = optimizer
        self.__dict__["_stage"] = parts  # the fit's Stage (run.py): its progress, precision, hooks
        object.__setattr__(self, "__class__",
                           type(f"Manual{type(optimizer).__name__}", (ManualOptimizer, type(optimizer)), {}))

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        """In manual optimization (Lightning's order): the closure, `on_before_optimizer_step`,
        the update, and one more `global_step`. In automatic optimization the loop hands this
        wrapper to `optimizer_step` with a closure that already runs those hooks, and counts."""
        parts = self._stage
        manual = not bool(getattr(parts.module, "automatic_optimization", True))
        if manual:
            closure = self._with_step_hooks(closure)
        result = parts.precision.optimizer_for_step(self.optimizer).step(closure=closure, **kwargs)
        if manual:
            parts.progress.global_step += 1
        return result

    def _with_step_hooks(self, closure: Any) -> Any:
        parts, optimizer = self._stage, self.optimizer

        def run_closure_then_hooks() -> Any:
            with torch.enable_grad():
                result = closure() if closure is not None else None
            parts.callbacks.call("on_before_optimizer_step", parts.trainer, parts.module, optimizer)
            return result

        return run_closure_then_hooks

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["optimizer"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["optimizer"], name, value)

    def __reduce__(self) -> Any:
        return (ManualOptimizer, (self.__dict__["optimizer"], None))
