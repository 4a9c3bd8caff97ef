"""One name logged with `self.log`: its options, and its epoch aggregate as it accumulates.

An entry lives per (stage, name) in the `MetricStore` (trainer/logged_metrics.py) from the first
`self.log` of that name in an epoch to the epoch's end. Epoch aggregates are exact: a mean keeps
the sum of value x batch size and the sum of batch sizes (not a mean of means), so the epoch value
of a sharded run equals one process on the same data once the two sums are reduced over ranks.
This file also turns what the user passed into the scalar tensor the store keeps.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.log_rules import LoggingError

_REDUCE_NAMES: dict[Any, str] = {"mean": "mean", "sum": "sum", "max": "max", "min": "min",
                                 torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min",
                                 max: "max", min: "min", sum: "sum"}


def stage_of(fx: str) -> str:
    """The loop stage a hook belongs to; epoch aggregates are kept per stage."""
    for stage, marker in (("validate", "validation"), ("test", "test"), ("predict", "predict")):
        if marker in fx:
            return stage
    return "train"


def reduce_fx_name(name: str, reduce_fx: Any) -> str:
    """Lightning's spellings: "mean"/"avg", "sum", "max", "min" (any case) or torch.mean/sum/max/min."""
    key = reduce_fx.lower() if isinstance(reduce_fx, str) else reduce_fx
    key = "mean" if key == "avg" else key
    if key not in _REDUCE_NAMES:
        raise LoggingError(f"self.log({name!r}, reduce_fx={reduce_fx!r}): expected one of 'mean', 'sum', 'max', "
                           "'min' (or torch.mean/sum/max/min).")
    return _REDUCE_NAMES[key]


@dataclass
class MetricEntry:
    """One (stage, name) of `self.log`: the options it was first logged with and its epoch aggregate."""

    fx: str  # the hook that first logged it
    name: str
    stage: str
    on_step: bool
    on_epoch: bool
    prog_bar: bool
    logger: bool
    reduce_fx: str
    sync_dist: bool
    total: torch.Tensor | None = None
    weight: float = 0.0
    metric: Any = None  # a torchmetrics.Metric: computed (and synced) by itself at epoch end
    pending_epoch: bool = field(default=False)
    suffix: str = ""  # "/dataloader_idx_N" when logged from one of several evaluation dataloaders
    # the evaluation dataloaders it was logged from (add_dataloader_idx=False keeps one name for all)
    logged_from: set[int] = field(default_factory=set)

    @property
    def full_name(self) -> str:
        return self.name + self.suffix

    def keys(self) -> tuple[str, str]:
        """(step key, epoch key) as the logger sees them (Lightning: `name_step/dataloader_idx_0`)."""
        if self.on_step and self.on_epoch:
            return f"{self.name}_step{self.suffix}", f"{self.name}_epoch{self.suffix}"
        return self.full_name, self.full_name

    def accumulate(self, tensor: torch.Tensor, batch_size: int) -> None:
        """Fold one step's value into the epoch aggregate, on the value's device (no sync per step)."""
        value = tensor.detach().to(torch.float64)
        if self.total is None:
            self.total = value * batch_size if self.reduce_fx == "mean" else value.clone()
        elif self.reduce_fx == "mean":
            self.total = self.total + value * batch_size
        elif self.reduce_fx == "sum":
            self.total = self.total + value
        else:
            extreme = torch.maximum if self.reduce_fx == "max" else torch.minimum
            self.total = extreme(self.total, value)
        self.weight += batch_size
        self.pending_epoch = True

    def epoch_total(self) -> torch.Tensor:
        """The accumulated total (for a mean, still to be divided by `weight`)."""
        if self.total is None:  # pending_epoch is only set together with a total
            raise RuntimeError(f"metric {self.name!r} is due for its epoch value but has none; this is a bug.")
        return self.total


def is_metric(value: Any) -> bool:
    """A torchmetrics `Metric` (recognised by its interface, so torchmetrics is never imported)."""
    return hasattr(value, "compute") and hasattr(value, "update") and hasattr(value, "reset")


def as_scalar(name: str, value: Any) -> torch.Tensor:
    """The logged value as a 0-d tensor (left on its device); refuses what is not one number."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise LoggingError(f"self.log({name!r}, ...) needs a scalar; got a tensor of shape {tuple(value.shape)}.")
        return value.detach().reshape(())
    if isinstance(value, numbers.Real):  # bools included, as in Lightning
        return torch.tensor(float(value))
    # a ValueError, as Lightning raises for a value of the wrong kind
    raise LoggingError(f"self.log({name!r}, ...) got a {type(value).__name__}; expected a number, a scalar tensor "
                       "or a torchmetrics Metric.")
