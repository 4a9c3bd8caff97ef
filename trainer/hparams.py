"""Hyperparameters: capture a module's `__init__` arguments and store them in checkpoints as Lightning does."""

from __future__ import annotations

import inspect
import pickle
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


def checkpoint_hparams(hparams: Any) -> dict[str, Any]:
    """Hyperparameters as a checkpoint stores them, as Lightning's do: primitives and containers as they
    are, OmegaConf containers as plain dicts and lists (a Hydra config still loads weights-only), and any
    other object as itself. A checkpoint holding such an object then loads only with
    `weights_only=False`, and `load_from_checkpoint` rebuilds the module with the object, as Lightning
    does from its own checkpoint of the same run (which needs the same opt-in). An object pickle cannot
    store is kept as its `repr`, with a warning, so a checkpoint is still written."""
    if hparams is None:
        return {}
    return {str(key): _stored(str(key), value) for key, value in dict(hparams).items()}


def _stored(key: str, value: Any) -> Any:
    if isinstance(value, _PRIMITIVES):
        return value
    if type(value) in (list, tuple):
        return type(value)(_stored(key, item) for item in value)
    if type(value) is dict or isinstance(value, AttributeDict):
        return {str(name): _stored(key, item) for name, item in value.items()}
    container = omegaconf_to_builtin(value)
    if container is not value:
        return _stored(key, container)
    try:
        pickle.dumps(value)
    except Exception as error:  # noqa: BLE001 (pickling can fail in any way the object defines)
        from strategies.rank_zero import rank_zero_warn

        rank_zero_warn(f"hyperparameter {key!r} ({type(value).__name__}) cannot be pickled ({error}); the "
                       "checkpoint stores its repr, so load_from_checkpoint needs it passed again: "
                       f"Model.load_from_checkpoint(path, {key}=...).")
        return repr(value)
    return value


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
