"""Fan a hook out to the callbacks (in list order) and then to the module, like Lightning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from trainer.callbacks.base import Callback
from trainer.module_adapter import set_current_hook


class CallbackList:
    """The Trainer's callbacks. `call(hook, ...)` runs `callback.hook(trainer, module, ...)` for
    each callback, then `module.hook(...)` when the module defines it."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        for callback in callbacks:
            if not isinstance(callback, Callback):
                raise TypeError(f"callbacks must be trainer.callbacks.Callback instances; got {type(callback).__name__}.")
        self.callbacks = list(callbacks)

    def call(self, hook: str, trainer: Any, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        self.call_callbacks(hook, trainer, module, *args, **kwargs)
        return self.call_module(hook, module, *args, **kwargs)

    def call_callbacks(self, hook: str, trainer: Any, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        for callback in self.callbacks:
            set_current_hook(module, hook)
            getattr(callback, hook)(trainer, module, *args, **kwargs)
        set_current_hook(module, None)

    @staticmethod
    def call_module(hook: str, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        method = getattr(module, hook, None)
        if not callable(method):
            return None
        set_current_hook(module, hook)
        try:
            return method(*args, **kwargs)
        finally:
            set_current_hook(module, None)

    def state_dict(self) -> dict[str, Any]:
        return {callback.state_key: callback.state_dict() for callback in self.callbacks}

    def load_state_dict(self, states: dict[str, Any]) -> None:
        for callback in self.callbacks:
            if callback.state_key in states:
                callback.load_state_dict(states[callback.state_key])

    def of_type(self, kind: type) -> list[Any]:
        return [callback for callback in self.callbacks if isinstance(callback, kind)]


def checkpoints_last(callbacks: Sequence[Callback]) -> list[Callback]:
    """Checkpoint-saving callbacks run after every other callback (as in Lightning), so a
    checkpoint holds the state other callbacks (EarlyStopping, say) reached in the same hook."""
    savers = [c for c in callbacks if hasattr(c, "best_model_path")]
    return [c for c in callbacks if c not in savers] + savers
