"""One training batch, in Lightning's order.

Automatic optimization runs the batch as a closure that the optimizer calls from its `step`
(so closure-based optimizers such as LBFGS work)::

    module.optimizer_step(epoch, batch_idx, optimizer, closure)
      -> optimizer.step(closure)
           closure: training_step -> [first micro-batch: on_before_zero_grad, optimizer_zero_grad]
                    -> on_before_backward -> module.backward (gradients reduced by the strategy)
                    -> on_after_backward
                    then: unscale -> non-finite check -> on_before_optimizer_step
                    -> configure_gradient_clipping
      -> the parameter update

A micro-batch that only accumulates runs the closure alone, under the strategy's `no_sync()`.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from strategies.rank_zero import rank_zero_warn
from trainer.backward import backward
from trainer.module_adapter import automatic_optimization, set_current_hook
from trainer.profiler import profile_strategy
from trainer.stage import Stage


class _SkipStep(Exception):
    """Raised inside the optimizer's closure to skip a step with non-finite gradients."""


def run_training_batch(parts: Stage, module: nn.Module, batch: Any, batch_idx: int, window_end: bool) -> Any:
    """Run one batch; returns Lightning's `outputs` for `on_train_batch_end`: a dict with the
    (accumulation-normalised, detached) "loss" and whatever else `training_step` returned."""
    if not automatic_optimization(module):
        return _run_manual_batch(parts, module, batch, batch_idx)
    optimizer = parts.attached.optimizers[0]
    closure = _Closure(parts, module, batch, batch_idx, optimizer,
                       zero_grad=batch_idx % parts.live.accumulate_grad_batches == 0)
    if not window_end:
        with parts.strategy.no_sync():
            closure()
    else:
        _optimizer_step(parts, module, batch_idx, optimizer, closure)
    return closure.outputs()


class _Closure:
    """training_step, zero_grad and backward of one micro-batch; remembers the step's output."""

    def __init__(self, parts: Stage, module: nn.Module, batch: Any, batch_idx: int, optimizer: Any,
                 zero_grad: bool) -> None:
        self.parts, self.module, self.batch, self.batch_idx = parts, module, batch, batch_idx
        self.optimizer, self.zero_grad = optimizer, zero_grad
        self.output: Any = None
        self.loss: torch.Tensor | None = None

    @torch.enable_grad()
    def __call__(self) -> torch.Tensor | None:
        parts, module, callbacks = self.parts, self.module, self.parts.callbacks
        self.output = training_step(parts, module, self.batch, self.batch_idx)
        loss = extract_loss(self.output)
        if loss is None and parts.strategy.world_size > 1:
            raise RuntimeError("training_step returned None under DDP: every rank must take part in every "
                               "gradient reduction. Return a loss on every rank (e.g. loss * 0 to skip a batch).")
        if loss is None:  # Lightning warns too (automatic optimization only)
            rank_zero_warn("`training_step` returned `None`, so this batch is skipped: no backward pass and no "
                           "optimizer update from it. Return the loss to train on it; skipping on purpose is fine.")
        if loss is not None:
            loss = _normalize(loss, parts.live.accumulate_grad_batches)
            self.loss = loss.detach().clone()
        if self.zero_grad:
            callbacks.call("on_before_zero_grad", parts.trainer, module, self.optimizer)
            callbacks.call_module("optimizer_zero_grad", module, parts.progress.current_epoch, self.batch_idx,
                                  self.optimizer)
        if loss is not None:
            backward(parts, module, loss)
        return self.loss

    def outputs(self) -> Any:
        if self.loss is None:  # Lightning hands on_train_batch_end an empty dict for a step without a loss
            return {}
        extra = {k: v for k, v in self.output.items() if k != "loss"} if isinstance(self.output, Mapping) else {}
        return {"loss": self.loss, **extra}


def _normalize(loss: torch.Tensor, accumulate_grad_batches: int) -> torch.Tensor:
    """The loss of one micro-batch, divided by the accumulation window. Without accumulation the
    division by 1 would change no value (x / 1 == x, NaN and -0.0 included) yet cost a device op
    forward and another backward on every step, so the loss is used as it is."""
    return loss if accumulate_grad_batches == 1 else loss / accumulate_grad_batches


def training_step(parts: Stage, module: nn.Module, batch: Any, batch_idx: int) -> Any:
    previous = set_current_hook(module, "training_step")
    try:
        with parts.precision.autocast(), profile_strategy(parts, "training_step"):
            args = (batch, batch_idx) if takes_batch_idx(module.training_step) else (batch,)
            return parts.strategy.training_step(module, *args)
    finally:
        set_current_hook(module, previous)


def takes_batch_idx(step: Any) -> bool:
    """Lightning passes `batch_idx` only to steps whose signature has room for it. Decided once per
    step function (the signature is read off the hot path's first batch, then cached)."""
    function = getattr(step, "__func__", None)  # a bound method: its function still lists `self`
    return _takes_batch_idx(function, 3) if function is not None else _takes_batch_idx(step, 2)


@functools.lru_cache(maxsize=256)
def _takes_batch_idx(function: Any, min_args: int) -> bool:
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return True
    return len([p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= min_args \
        or any(p.name == "batch_idx" for p in parameters)


def _optimizer_step(parts: Stage, module: nn.Module, batch_idx: int, optimizer: Any, closure: _Closure) -> None:
    """Hand the closure to the module's `optimizer_step`; the optimizer runs it, then the hooks that
    need the reduced gradients run, then the update. Every rank has identical gradients here."""
    callbacks, precision = parts.callbacks, parts.precision
    ran: list[bool] = []

    def closure_then_prepare_step() -> Any:
        ran.append(True)
        loss = closure()
        precision.unscale(optimizer)
        if not parts.fit_run.nonfinite_watch.usable(
                parts.strategy, optimizer, extract_loss(closure.output), policy=parts.fixed.on_nonfinite,
                scaled=precision.scaler is not None, step=parts.progress.global_step,
                epoch=parts.progress.current_epoch):
            raise _SkipStep
        callbacks.call("on_before_optimizer_step", parts.trainer, module, optimizer)
        callbacks.call_module("configure_gradient_clipping", module, optimizer,
                              gradient_clip_val=parts.live.gradient_clip_val,
                              gradient_clip_algorithm=parts.live.gradient_clip_algorithm)
        return loss

    try:
        callbacks.call_module("optimizer_step", module, parts.progress.current_epoch, batch_idx,
                              parts.attached.wrapped_optimizers[0], closure_then_prepare_step)
    except _SkipStep:
        return
    if not ran:  # training_step and backward never ran: the "step" would silently train nothing
        raise RuntimeError(f"{type(module).__name__}.optimizer_step() did not run its `optimizer_closure` (which runs "
                           "training_step and backward): pass it on, `optimizer.step(closure=optimizer_closure)`.")
    parts.progress.global_step += 1


def _run_manual_batch(parts: Stage, module: nn.Module, batch: Any, batch_idx: int) -> Any:
    """Manual optimization: the module calls `manual_backward` and `optimizer.step()` itself;
    the optimizers it gets from `self.optimizers()` count steps into `global_step`."""
    output = training_step(parts, module, batch, batch_idx)
    if output is None:
        return {}
    if isinstance(output, torch.Tensor):
        return {"loss": output.detach()}
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        return {**output, "loss": output["loss"].detach()}
    if isinstance(output, Mapping):
        return dict(output)
    raise TypeError(f"{type(module).__name__}.training_step returned a {type(output).__name__}; in manual "
                    "optimization it returns a tensor, a dict, or nothing.")


def step_schedulers(parts: Stage, module: nn.Module, interval: str, batch_idx: int = 0,
                    plateau: bool | None = None) -> None:
    """Step the schedulers of `interval` whose frequency is due (Lightning counts "step" schedulers by
    the batch index in the epoch, "epoch" ones by epoch); plateau ones read their monitor, and are
    stepped separately (after validation) when `plateau` is given. Manual optimization steps its
    schedulers itself."""
    if not automatic_optimization(module):
        return
    counter = batch_idx + 1 if interval == "step" else parts.progress.current_epoch + 1
    for config in parts.attached.lr_scheduler_configs:
        if config.interval != interval or counter % config.frequency != 0:
            continue
        if plateau is not None and config.reduce_on_plateau != plateau:
            continue
        metric = None
        if config.reduce_on_plateau:
            metric = parts.metrics.callback_metrics.get(config.monitor) if config.monitor else None
            if metric is None:
                if config.strict:
                    raise KeyError(f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; logged: "
                                   f"{sorted(parts.metrics.callback_metrics)}. Log it or set 'strict': False.")
                warnings.warn(f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged, and strict is "
                              "False: its step is skipped.", RuntimeWarning, stacklevel=2)
                continue
        parts.callbacks.call_module("lr_scheduler_step", module, config.scheduler, metric)
        parts.progress.scheduler_steps += 1
        parts.progress.scheduler_steps_in_epoch += 1


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


