"""One training batch: forward, backward (gradients reduced by the strategy), and, on the last
micro-batch of an accumulation window, unscale -> clip -> step -> schedulers -> zero_grad.

Every hook and every strategy call of a training step is visible in `run_training_batch`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainer.module_adapter import automatic_optimization, set_current_hook


def run_training_batch(trainer: Any, module: nn.Module, batch: Any, batch_idx: int, window_end: bool) -> Any:
    """Run one batch; returns what `training_step` returned (Lightning's `outputs`).

    `window_end` is True on the last micro-batch of a gradient-accumulation window: only
    then are gradients synchronised across ranks and the optimizer stepped.
    """
    strategy, precision, callbacks = trainer.strategy, trainer.precision_plugin, trainer.callback_list
    if not automatic_optimization(module):
        return _run_manual_batch(trainer, module, batch, batch_idx)

    sync_context = contextlib.nullcontext() if window_end else strategy.no_sync()
    with sync_context:
        output = _training_step(trainer, module, batch, batch_idx)
        loss = extract_loss(output)
        if loss is not None:
            loss = loss / trainer.accumulate_grad_batches
            callbacks.call("on_before_backward", trainer, module, loss)
            strategy.backward(precision.scale_loss(loss))
            callbacks.call("on_after_backward", trainer, module)

    if window_end and trainer.optimizers:
        _optimizer_step(trainer, module, batch_idx, output)
    return output


def _training_step(trainer: Any, module: nn.Module, batch: Any, batch_idx: int) -> Any:
    set_current_hook(module, "training_step")
    try:
        with trainer.precision_plugin.autocast():
            return trainer.strategy.training_step(module, batch, batch_idx)
    finally:
        set_current_hook(module, None)


def _optimizer_step(trainer: Any, module: nn.Module, batch_idx: int, output: Any) -> None:
    """Runs after the reduction, on every rank, with identical gradients everywhere."""
    optimizer = trainer.optimizers[0]
    callbacks, precision = trainer.callback_list, trainer.precision_plugin
    precision.unscale(optimizer)
    if not _gradients_usable(trainer, optimizer, output):
        callbacks.call_module("optimizer_zero_grad", module, trainer.current_epoch, batch_idx, optimizer)
        return
    callbacks.call("on_before_optimizer_step", trainer, module, optimizer)
    if trainer.gradient_clip_val:
        callbacks.call_module("configure_gradient_clipping", module, optimizer,
                              trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
    loss = extract_loss(output)
    callbacks.call_module("optimizer_step", module, trainer.current_epoch, batch_idx,
                          precision.optimizer_for_step(optimizer), lambda: loss)
    trainer.loop_state.global_step += 1
    step_schedulers(trainer, module, "step")
    callbacks.call("on_before_zero_grad", trainer, module, optimizer)
    callbacks.call_module("optimizer_zero_grad", module, trainer.current_epoch, batch_idx, optimizer)


def _gradients_usable(trainer: Any, optimizer: Any, output: Any) -> bool:
    """Non-finite gradients: raise naming the step and the ranks whose loss was non-finite, or
    skip the step (`on_nonfinite="skip"`). Gradients are identical on every rank after the
    reduction, so every rank takes the same branch. A GradScaler handles overflow itself."""
    if trainer.on_nonfinite == "ignore" or trainer.precision_plugin.scaler is not None:
        return True
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads or bool(torch.isfinite(torch.nn.utils.get_total_norm(grads))):
        return True
    if trainer.on_nonfinite == "skip":
        warnings.warn(f"step {trainer.global_step}: non-finite gradients, optimizer step skipped "
                      "(on_nonfinite='skip').", stacklevel=2)
        return False
    loss = extract_loss(output)
    finite = torch.tensor([1.0 if loss is None or bool(torch.isfinite(loss.detach()).all()) else 0.0])
    flags = trainer.strategy.all_gather(finite.to(trainer.strategy.root_device)).flatten().tolist()
    culprits = [rank for rank, flag in enumerate(flags) if flag == 0.0]
    where = f"the loss was non-finite on rank(s) {culprits}" if culprits else "every rank's loss was finite"
    raise FloatingPointError(f"step {trainer.global_step}, epoch {trainer.current_epoch}: gradients are NaN/inf "
                             f"after the reduction; {where}. Lower the learning rate, clip gradients, check the "
                             "data, or pass on_nonfinite='skip' to skip such steps.")


def _run_manual_batch(trainer: Any, module: nn.Module, batch: Any, batch_idx: int) -> Any:
    """Manual optimization: the module calls `manual_backward` and `optimizer.step()` itself;
    the optimizers it gets from `self.optimizers()` count steps into `global_step`."""
    return _training_step(trainer, module, batch, batch_idx)


def step_schedulers(trainer: Any, module: nn.Module, interval: str) -> None:
    """Step the schedulers of `interval` whose frequency is due; plateau ones read their monitor."""
    counter = trainer.global_step if interval == "step" else trainer.current_epoch + 1
    for config in trainer.lr_scheduler_configs:
        if config.interval != interval or counter % config.frequency != 0:
            continue
        metric = None
        if config.reduce_on_plateau:
            metric = trainer.callback_metrics.get(config.monitor)
            if metric is None:
                if config.strict:
                    raise KeyError(f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; logged: "
                                   f"{sorted(trainer.callback_metrics)}. Log it or set 'strict': False.")
                continue
        trainer.callback_list.call_module("lr_scheduler_step", module, config.scheduler, metric)


def extract_loss(output: Any) -> torch.Tensor | None:
    """`training_step` may return a loss tensor, a dict with "loss", or None (skip the batch)."""
    if output is None:
        return None
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        if "loss" not in output:
            raise KeyError(f"training_step returned a dict without 'loss' (keys: {sorted(output)}); "
                           "return the loss tensor or a dict with a 'loss' key.")
        return output["loss"]
    raise TypeError(f"training_step returned a {type(output).__name__}; expected a loss tensor, a dict with "
                    "'loss', or None.")
