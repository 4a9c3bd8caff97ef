"""Fan a hook out to the callbacks (in list order) and then to the module, like Lightning.

Callbacks may be ours (`trainer.callbacks.Callback`) or Lightning's (`pytorch_lightning` /
`lightning.pytorch` `Callback` subclasses): both expose the same hooks with the same
arguments. A callback's kind (checkpointing, early stopping, ...) is recognised by type: our
own classes by `isinstance`, Lightning's through `trainer.lightning_types`, which finds them
among the modules already imported and so never imports Lightning. A user's class that merely
shares a name with one of Lightning's (`EarlyStopping`) is therefore never taken for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from trainer.callbacks.base import Callback
from trainer.callbacks.early_stopping import EarlyStopping
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.callbacks.model_summary import ModelSummary
from trainer.callbacks.progress import TQDMProgressBar
from trainer.contract import TrainerContract
from trainer.lightning_types import is_lightning_instance
from trainer.module_adapter import set_current_hook


def adopt_callback(callback: Any) -> Any:
    """Accept our callbacks and Lightning's; refuse anything else naming what was passed."""
    if isinstance(callback, Callback) or is_lightning_instance(callback, "callbacks.Callback"):
        return callback
    raise TypeError(f"callbacks must be Callback instances (trainer.callbacks.Callback or Lightning's Callback); "
                    f"got {type(callback).__name__}.")


def is_checkpoint(callback: Any) -> bool:
    """Ours, Lightning's `Checkpoint` family, or any callback that tracks a `best_model_path`."""
    return hasattr(callback, "best_model_path") or isinstance(callback, ModelCheckpoint) \
        or is_lightning_instance(callback, "callbacks.Checkpoint")


def is_early_stopping(callback: Any) -> bool:
    return isinstance(callback, EarlyStopping) or is_lightning_instance(callback, "callbacks.EarlyStopping")


def is_progress_bar(callback: Any) -> bool:
    return isinstance(callback, TQDMProgressBar) or is_lightning_instance(callback, "callbacks.ProgressBar")


def is_model_summary(callback: Any) -> bool:
    return isinstance(callback, ModelSummary) or is_lightning_instance(callback, "callbacks.ModelSummary")


def is_monitoring(callback: Any) -> bool:
    """Checkpointing and early stopping read the epoch's final metrics: at epoch end they run after
    the module's own hook (which may still log), as in Lightning."""
    return is_checkpoint(callback) or is_early_stopping(callback)


_LENT = ("log", "log_dict")


class CallbackList:
    """The Trainer's callbacks. `call(hook, ...)` runs `callback.hook(trainer, module, ...)` for
    each callback, then `module.hook(...)` when the module defines it."""

    def __init__(self, callbacks: Sequence[Any], profiler: Any = None) -> None:
        self.callbacks = [adopt_callback(callback) for callback in callbacks]
        self.profiler = profiler  # times each hook call when given (trainer/profiler.py); None: untimed

    def call(self, hook: str, trainer: TrainerContract, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        self.call_callbacks(hook, trainer, module, *args, **kwargs)
        return self.call_module(hook, module, *args, **kwargs)

    def call_epoch_end(self, hook: str, trainer: TrainerContract, module: nn.Module, before_monitoring: Any = None) -> None:
        """Epoch-end order: other callbacks, the module, then checkpointing and early stopping, which
        see what the module logged in this very hook (`before_monitoring` publishes it)."""
        self.call_callbacks(hook, trainer, module, monitoring=False)
        self.call_module(hook, module)
        if before_monitoring is not None:
            before_monitoring()
        self.call_callbacks(hook, trainer, module, monitoring=True)

    def add_module_callbacks(self, extra: Sequence[Any]) -> None:
        """The module's `configure_callbacks()`: each replaces the Trainer's callbacks of its type (Lightning's
        rule), the rest are added; checkpointing stays last."""
        adopted = [adopt_callback(callback) for callback in extra]
        replaced = {type(callback) for callback in adopted}
        kept = [c for c in self.callbacks if type(c) not in replaced and c not in adopted]
        self.callbacks[:] = checkpoints_last(kept + adopted)

    def lend_logging(self, module: nn.Module) -> None:
        """`self.log(...)` / `self.log_dict(...)` inside a callback hook log through the module, as in
        Lightning (the values count as logged from that hook), for one stage. A callback's own `log`
        is kept."""
        for callback in self.callbacks:
            for name in _LENT:
                if not callable(getattr(type(callback), name, None)) and callable(getattr(module, name, None)):
                    callback.__dict__[name] = getattr(module, name)

    def take_back_logging(self) -> None:
        """Undo `lend_logging` (the callbacks must not keep this stage's module)."""
        for callback in self.callbacks:
            for name in _LENT:
                if not callable(getattr(type(callback), name, None)):
                    getattr(callback, "__dict__", {}).pop(name, None)

    def call_callbacks(self, hook: str, trainer: TrainerContract, module: nn.Module, *args: Any,
                       monitoring: bool | None = None, **kwargs: Any) -> None:
        previous = set_current_hook(module, hook)
        try:
            for callback in self.callbacks:
                if monitoring is not None and is_monitoring(callback) != monitoring:
                    continue
                method = getattr(callback, hook, None)
                if method is None:
                    continue
                if self.profiler is None:
                    method(trainer, module, *args, **kwargs)
                    continue
                with self.profiler.profile(f"[Callback]{getattr(callback, 'state_key', type(callback).__qualname__)}"
                                           f".{hook}"):
                    method(trainer, module, *args, **kwargs)
        finally:
            set_current_hook(module, previous)

    def call_module(self, hook: str, module: Any, *args: Any, **kwargs: Any) -> Any:
        """`module.hook(...)` when the module (or datamodule) defines it, with `self.log` knowing the hook."""
        method = getattr(module, hook, None)
        if not callable(method):
            return None
        previous = set_current_hook(module, hook)
        try:
            if self.profiler is None:
                return method(*args, **kwargs)
            kind = "LightningModule" if isinstance(module, nn.Module) else "LightningDataModule"
            with self.profiler.profile(f"[{kind}]{type(module).__name__}.{hook}"):
                return method(*args, **kwargs)
        finally:
            set_current_hook(module, previous)

    def state_dict(self) -> dict[str, Any]:
        states = {}
        for callback in self.callbacks:
            state = callback.state_dict()
            if state:
                states[callback.state_key] = state
        return states

    def load_state_dict(self, states: dict[str, Any]) -> None:
        for callback in self.callbacks:
            if callback.state_key in states:
                callback.load_state_dict(states[callback.state_key])

    def of_type(self, kind: type) -> list[Any]:
        return [callback for callback in self.callbacks if isinstance(callback, kind)]


def checkpoints_last(callbacks: Sequence[Any]) -> list[Any]:
    """Checkpoint-saving callbacks run after every other callback (as in Lightning), so a
    checkpoint holds the state other callbacks (EarlyStopping, say) reached in the same hook."""
    savers = [c for c in callbacks if is_checkpoint(c)]
    return [c for c in callbacks if c not in savers] + savers
