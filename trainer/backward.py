"""One backward pass with its hooks, shared by automatic optimization (trainer/loops/training_step.py),
`manual_backward` and the `parts.strategy.backward` a Lightning module may call: it lives below the loops
so that the module API reaches it without importing a loop."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.profiler import profile_strategy
from trainer.stage import Stage


def backward(parts: Stage, module: nn.Module, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """on_before_backward -> the module's `backward` hook (the strategy reduces the gradients it
    produces) -> on_after_backward; shared by automatic and manual optimization."""
    callbacks, precision = parts.callbacks, parts.precision
    loss = precision.scale_loss(loss)
    callbacks.call("on_before_backward", parts.trainer, module, loss)
    with profile_strategy(parts, "backward"):
        parts.strategy.backward(loss, run=lambda tensor: callbacks.call_module("backward", module, tensor,
                                                                                 *args, **kwargs))
    callbacks.call("on_after_backward", parts.trainer, module)
