"""The CLI's schema of a strategy group, read off the strategy's constructor.

A strategy argument lives in two places: the constructor (its name, type, default and checks) and
`conf/strategy/<name>.yaml` (the CLI's default and its comment). The schema Hydra checks overrides
against (a typo'd key, `max_restarts=abc`) is derived here from the constructor's signature, and the
checks run when `trainer.cli.config.validate` builds the strategy, so no third copy can drift.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from datetime import timedelta
from typing import Any, Optional

_NOT_FROM_THE_CLI = ("self", "accelerator", "checkpoint_io")  # the Trainer passes these, or Python only
_PLAIN = (bool, int, float, str)


@dataclasses.dataclass
class TimeoutConfig:
    """A `datetime.timedelta` argument, built by Hydra from seconds."""

    _target_: str = "datetime.timedelta"
    seconds: float = 600.0


def strategy_schema(cls: type, target: str) -> type:
    """A structured-config dataclass with one field per constructor argument the CLI may set: typed where
    OmegaConf can check the type (bool, int, float, str, optionally None), `Any` elsewhere (the
    constructor checks those), defaults from the signature."""
    hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    fields: list[tuple[str, Any, Any]] = [("_target_", str, dataclasses.field(default=target))]
    for name, parameter in inspect.signature(cls.__init__).parameters.items():  # type: ignore[misc]
        if name in _NOT_FROM_THE_CLI or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        fields.append((name, *_field(hints.get(name, Any), parameter.default)))
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields)


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
