"""A config group's schema, read off the signature of the constructor it feeds.

An argument of the Trainer or of a strategy lives in two places: its constructor (name, type, default
and checks) and `conf/<group>/*.yaml` (the CLI's value and its comment). The schema Hydra checks
overrides against (a typo'd key, `trainer.max_epochs=abc`) is derived here from the signature, and the
checks run when `trainer.cli.checks.validate` hands the values to the constructor's own rules, so no
third copy can drift.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any, Optional

from omegaconf import MISSING

_PLAIN = (bool, int, float, str)


@dataclasses.dataclass
class TimeoutConfig:
    """A `datetime.timedelta` argument, built by Hydra from seconds."""

    _target_: str = "datetime.timedelta"
    seconds: float = 600.0


def signature_schema(function: Callable[..., Any], name: str, *, leave_out: Collection[str],
                     target: str | None = None) -> type:
    """A structured-config dataclass called `name`, with one field per argument of `function` the CLI
    may set (all but `self`, `*args`, `**kwargs` and `leave_out`): typed where OmegaConf can check the
    type (bool, int, float, str, optionally None), `Any` elsewhere (the constructor checks those),
    defaults from the signature. `target` adds the `_target_` Hydra instantiates."""
    hints = typing.get_type_hints(function)
    fields: list[tuple[str, Any, Any]] = []
    if target is not None:
        fields.append(("_target_", str, dataclasses.field(default=target)))
    for argument, parameter in inspect.signature(function).parameters.items():
        if argument == "self" or argument in leave_out or parameter.kind in (parameter.VAR_POSITIONAL,
                                                                             parameter.VAR_KEYWORD):
            continue
        default = MISSING if parameter.default is parameter.empty else parameter.default
        fields.append((argument, *_field(hints.get(argument, Any), default)))
    return dataclasses.make_dataclass(name, fields)


def _field(hint: Any, default: Any) -> tuple[Any, Any]:
    if isinstance(default, timedelta):
        seconds = default.total_seconds()
        return TimeoutConfig, dataclasses.field(default_factory=lambda: TimeoutConfig(seconds=seconds))
    return _checkable_type(hint), dataclasses.field(default=default)


def _checkable_type(hint: Any) -> Any:
    """`hint` when OmegaConf can check it (a plain type, or one plain type or None), else Any."""
    if hint in _PLAIN:
        return hint
    members = typing.get_args(hint)
    plain = [member for member in members if member is not type(None)]
    if type(None) in members and len(plain) == 1 and plain[0] in _PLAIN:
        return Optional[plain[0]]
    return Any
