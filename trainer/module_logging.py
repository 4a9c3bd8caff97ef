"""`self.log` and `self.log_dict`: checked here, stored by the Trainer's `MetricStore`.

Module-level functions, not methods, so the same code serves our `LightningModule` (its `log`
calls `log(self, ...)`) and an unchanged `pytorch_lightning.LightningModule`, on which
trainer/module_adapter.py binds them for the length of a run. `log` runs for every value logged
in every step, so `self.log` reaches it in one plain call and it hands the value straight on.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from strategies.rank_zero import rank_zero_warn
from trainer.log_rules import LoggingError
from trainer.metric_entry import is_metric as _is_metric

_metric_ids: weakref.WeakKeyDictionary[nn.Module, set[int]] = weakref.WeakKeyDictionary()
_LOG_KEYS = ("prog_bar", "logger", "on_step", "on_epoch", "reduce_fx", "sync_dist", "batch_size",
             "enable_graph", "sync_dist_group", "add_dataloader_idx", "metric_attribute", "rank_zero_only")


def log(module: nn.Module, name: str, value: Any, **kwargs: Any) -> None:
    """`self.log`: hand the value to the trainer's metric store with the current hook's defaults."""
    unknown = set(kwargs) - set(_LOG_KEYS)
    if unknown:
        raise TypeError(f"self.log() got unexpected arguments {sorted(unknown)}; allowed: {list(_LOG_KEYS)}.")
    trainer = getattr(module, "_trainer", None)
    if trainer is None:  # a step called by hand, e.g. in a test: nothing to log to (as in Lightning)
        warnings.warn(f"self.log({name!r}) is ignored: {type(module).__name__} is not attached to a Trainer.",
                      stacklevel=3)
        return
    if getattr(trainer, "barebones", False):  # Lightning drops the value with a warning
        rank_zero_warn(f"self.log({name!r}) is ignored: Trainer(barebones=True) turns logging off for raw speed.")
        return
    fx = getattr(module, "_current_fx_name", None)
    if fx is None:
        raise LoggingError(f"self.log({name!r}) was called outside the steps and hooks the Trainer runs, so no hook "
                           "decides how to log it; log from a step or a hook.")
    if _is_metric(value) and kwargs.get("metric_attribute") is None:
        _check_metric_attribute(module, name, value)
    if kwargs.get("logger") and trainer.logger is None:  # asked for explicitly (the default is None)
        rank_zero_warn(f"self.log({name!r}, ..., logger=True): this Trainer has no logger, so the value reaches "
                       "only the callback and progress-bar metrics; pass Trainer(logger=...) to record it.")
    if kwargs.get("logger", True) is None:  # Lightning's default: the logger gets it
        kwargs["logger"] = True
    trainer.metric_store.log(fx, name, value, **{k: v for k, v in kwargs.items()
                                                 if k not in ("enable_graph", "sync_dist_group",
                                                              "metric_attribute", "rank_zero_only")})


def _check_metric_attribute(module: nn.Module, name: str, metric: Any) -> None:
    """A logged torchmetrics object must be one of the module's submodules (Lightning's rule: that is
    how it is found again, e.g. to be reset and moved with the module). The module's metrics are
    listed once and again only when an unknown one is logged, not on every batch."""
    known = _metric_ids.get(module)
    if known is None or id(metric) not in known:
        known = _metric_ids[module] = {id(child) for child in module.modules() if _is_metric(child)}
    if id(metric) in known:
        return
    owned = [child_name for child_name, child in module.named_modules() if _is_metric(child)]
    hint = (f"pass metric_attribute= naming one of {owned}" if owned
            else "assign the metric to an attribute of the module in __init__")
    raise LoggingError(f"self.log({name!r}, <{type(metric).__name__}>): this metric is not an attribute of "
                       f"{type(module).__name__}; {hint}.")


def log_dict(module: nn.Module, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
    for name, value in _loggable_items(dictionary):
        log(module, name, value, **kwargs)


def _loggable_items(dictionary: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    """A dict's items; a torchmetrics MetricCollection's metrics under their prefixed names, and,
    when it has compute groups, sharing their group's state by reference (copying it into every
    member on each call is what compute groups avoid), as Lightning takes them."""
    torchmetrics = sys.modules.get("torchmetrics")  # a MetricCollection means torchmetrics is imported
    if torchmetrics is not None and isinstance(dictionary, torchmetrics.MetricCollection):
        shares_state = bool(getattr(dictionary, "_enable_compute_groups", False))
        return dictionary.items(keep_base=False, copy_state=not shares_state)
    return dictionary.items()
