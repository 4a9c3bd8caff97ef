"""The optimizer side of the module API: `self.optimizers()`, `self.lr_schedulers()`,
`self.manual_backward`, `self.clip_gradients`, `self.toggle_optimizer` / `untoggle_optimizer`.

Module-level functions for the same reason as trainer/module_logging.py: they serve our
`LightningModule` and, bound by trainer/module_adapter.py, an unchanged Lightning module. Each
reaches the Trainer through the module's `_trainer` and reads only its public members.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.backward import backward
from trainer.stage import Stage


def optimizers(module: nn.Module, use_pl_optimizer: bool = True) -> Any:
    """The optimizers; wrapped (stepping counts into global_step, loss scaling applied) unless
    `use_pl_optimizer=False`."""
    trainer = _trainer_of(module)
    opts = trainer.wrapped_optimizers if use_pl_optimizer else trainer.optimizers
    return opts[0] if len(opts) == 1 else opts


def lr_schedulers(module: nn.Module) -> Any:
    schedulers = [config.scheduler for config in _trainer_of(module).lr_scheduler_configs]
    if not schedulers:
        return None
    return schedulers[0] if len(schedulers) == 1 else schedulers


def manual_backward(module: nn.Module, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """Manual optimization's backward (Lightning's order): precision scaling, on_before_backward,
    the module's `backward` hook with `args`/`kwargs` (e.g. retain_graph=True) under the
    strategy's gradient sync, on_after_backward."""
    trainer = _trainer_of(module)
    if getattr(module, "automatic_optimization", True):
        raise RuntimeError("manual_backward() is for manual optimization: set `self.automatic_optimization = False` "
                           "in __init__, or return the loss from training_step.")
    backward(Stage.of(trainer), module, loss, *args, **kwargs)  # the module API holds the Trainer alone


def clip_gradients(module: nn.Module, optimizer: Any, gradient_clip_val: float | None = None,
                   gradient_clip_algorithm: str | None = None) -> None:
    """Clip the optimizer's gradients; a value left as None takes the Trainer's argument. Passing
    values here while the Trainer also sets them is ambiguous and raises, as in Lightning."""
    trainer = getattr(module, "_trainer", None)
    trainer_val = getattr(trainer, "gradient_clip_val", None)
    trainer_algorithm = getattr(trainer, "gradient_clip_algorithm", None)
    if gradient_clip_val is not None and trainer_val is not None and gradient_clip_val != trainer_val:
        raise ValueError(f"clip_gradients(gradient_clip_val={gradient_clip_val}) conflicts with "
                         f"Trainer(gradient_clip_val={trainer_val}); set it in one place only.")
    if gradient_clip_algorithm is not None and trainer_algorithm is not None \
            and gradient_clip_algorithm != trainer_algorithm:
        raise ValueError(f"clip_gradients(gradient_clip_algorithm={gradient_clip_algorithm!r}) conflicts with "
                         f"Trainer(gradient_clip_algorithm={trainer_algorithm!r}); set it in one place only.")
    gradient_clip_val = gradient_clip_val if gradient_clip_val is not None else (trainer_val or 0.0)
    algorithm = gradient_clip_algorithm or trainer_algorithm or "norm"
    _trainer_of(module).precision_plugin.clip_gradients(optimizer, gradient_clip_val, algorithm)


def toggle_optimizer(module: nn.Module, optimizer: Any) -> None:
    """Freeze parameters that belong only to other optimizers (multi-optimizer training)."""
    own = {id(p) for group in optimizer.param_groups for p in group["params"]}
    saved: dict[torch.Tensor, bool] = {}
    for other in _trainer_of(module).optimizers:
        for group in other.param_groups:
            for parameter in group["params"]:
                if id(parameter) not in own:
                    saved.setdefault(parameter, parameter.requires_grad)
                    parameter.requires_grad = False
    module.__dict__["_toggled_requires_grad"] = saved


def untoggle_optimizer(module: nn.Module, optimizer: Any) -> None:
    for parameter, requires_grad in module.__dict__.pop("_toggled_requires_grad", {}).items():
        parameter.requires_grad = requires_grad


def _trainer_of(module: nn.Module) -> Any:
    trainer = getattr(module, "_trainer", None)
    if trainer is None:
        raise RuntimeError(f"{type(module).__name__} is not attached to a Trainer; call Trainer.fit(model) first.")
    return trainer
