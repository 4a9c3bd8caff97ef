"""Hyperparameters: capture a module's `__init__` arguments and keep them checkpoint-safe."""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

_PRIMITIVES = (str, int, float, bool, type(None))


class AttributeDict(dict):  # type: ignore[type-arg]
    """A dict whose keys read like attributes: `self.hparams.lr`."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as error:
            raise AttributeError(f"hparams has no key {key!r}; known: {sorted(self)}") from error

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def collect_init_args(frame: types.FrameType) -> dict[str, Any]:
    """The arguments of the `__init__` running in `frame`, minus `self`/`__class__`."""
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    local_vars = frame.f_locals
    args = {name: local_vars[name] for name in names if name not in ("self", "__class__") and name in local_vars}
    if code.co_flags & inspect.CO_VARKEYWORDS:
        has_varargs = bool(code.co_flags & inspect.CO_VARARGS)
        varkw_name = code.co_varnames[code.co_argcount + code.co_kwonlyargcount + has_varargs]
        args.update(local_vars.get(varkw_name, {}))
    return args


def plain_hparams(hparams: Any) -> dict[str, Any]:
    """Hyperparameters reduced to what `torch.load(weights_only=True)` accepts: primitives and
    containers of them; anything else is stored as its `repr` so saving never fails."""
    if hparams is None:
        return {}
    return {str(key): _plain(value) for key, value in dict(hparams).items()}


def _plain(value: Any) -> Any:
    if isinstance(value, _PRIMITIVES):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    container = omegaconf_to_builtin(value)
    return repr(value) if container is value else _plain(container)


def omegaconf_to_builtin(value: Any) -> Any:
    """An OmegaConf container as plain dicts and lists (interpolations resolved); anything else as is.

    OmegaConf is looked up in `sys.modules` instead of imported: a value can only be one of its
    containers if the program already imported it, and importing it here would add 0.1 s and
    7 MiB to every rank of every run that never uses Hydra.
    """
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(value, omegaconf.Container):
        return omegaconf.OmegaConf.to_container(value, resolve=True)
    return value
