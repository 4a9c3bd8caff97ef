"""Numerical precision: autocast, loss scaling and dtype conversion behind one small object."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from strategies.zero import clip_grad_norm_

PRECISIONS = ("32-true", "64-true", "16-mixed", "bf16-mixed")
_ALIASES = {"32": "32-true", "64": "64-true", "16": "16-mixed", "bf16": "bf16-mixed"}


def normalize_precision(precision: str | int) -> str:
    """Lightning's name for `precision`, given as one or as a short alias (32, 64, "16", "bf16"): the one
    place both the Trainer and the CLI (which names the key) check it."""
    name = _ALIASES.get(str(precision), str(precision))
    if name not in PRECISIONS or isinstance(precision, bool):
        raise ValueError(f"precision={precision!r} is not one of {list(PRECISIONS)} (aliases: 32, 64, 16, 'bf16').")
    return name


class Precision:
    """One precision policy. The loop calls, in order: `convert_module` once, `autocast()` around
    each forward, `scale_loss` before backward, `unscale` before clipping, `optimizer_for_step`
    to step (a GradScaler skips steps whose gradients overflowed)."""

    def __init__(self, precision: str | int, device_type: str) -> None:
        self.name = normalize_precision(precision)
        self.device_type = device_type
        self.scaler: torch.amp.GradScaler | None = None
        if self.name == "16-mixed":
            self.scaler = torch.amp.GradScaler(device_type)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(self.name)

    @property
    def module_dtype(self) -> torch.dtype | None:
        """The dtype the module's floating-point parameters train in (None: as they were created)."""
        return torch.float64 if self.name == "64-true" else None

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module if self.module_dtype is None else module.to(self.module_dtype)

    def convert_input(self, batch: Any) -> Any:
        """64-true feeds float64 to a float64 model; other precisions leave inputs alone."""
        if self.name != "64-true":
            return batch
        return _map_tensors(batch, lambda t: t.double() if t.is_floating_point() else t)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        dtype = self.autocast_dtype
        if dtype is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=dtype):
            yield

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def clip_gradients(self, optimizer: torch.optim.Optimizer, clip_val: float = 0.0,
                       gradient_clip_algorithm: str = "norm") -> None:
        """Clip the optimizer's (unscaled) gradients by total norm or by value; 0 clips nothing.
        Lightning's modules call this with the same arguments from their own `clip_gradients`."""
        if clip_val <= 0:
            return
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        algorithm = str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm))
        if algorithm == "norm":
            clip_grad_norm_(optimizer, parameters, clip_val)  # a ZeRO shard's by the whole gradients' norm
        elif algorithm == "value":
            torch.nn.utils.clip_grad_value_(parameters, clip_val)
        else:
            raise ValueError(f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not supported; use 'norm' or "
                             "'value'.")

    def optimizer_for_step(self, optimizer: torch.optim.Optimizer) -> Any:
        """What the module's `optimizer_step` hook calls `.step()` on."""
        return optimizer if self.scaler is None else _ScaledOptimizer(optimizer, self.scaler)

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


class _ScaledOptimizer:
    """Routes `step()` through the GradScaler so user `optimizer_step` overrides keep working."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        self._optimizer = optimizer
        self._scaler = scaler

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        with torch.enable_grad():
            result = closure() if closure is not None else None
        self._scaler.step(self._optimizer, **kwargs)
        self._scaler.update()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


def _map_tensors(data: Any, fn: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        return {k: _map_tensors(v, fn) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        mapped = [_map_tensors(v, fn) for v in data]
        return type(data)(mapped) if not hasattr(data, "_fields") else type(data)(*mapped)
    return data


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) batch to `device`; an object with its own `.to(device)`
    (a custom batch class) moves itself, as in Lightning."""
    non_blocking = device.type == "cuda"
    if not isinstance(batch, (torch.Tensor, dict, list, tuple)) and callable(getattr(batch, "to", None)):
        return batch.to(device)
    return _map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))
