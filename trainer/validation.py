"""Trainer argument checks: fail in __init__, before any process starts, naming the argument.

`resolve_trainer_args` also turns Lightning's `None` ("the default") into the value it stands
for, and applies `barebones` and `overfit_batches`, so the Trainer stores plain values.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

import torch

from trainer.precision import normalize_precision

def as_items(value: Any) -> list[Any]:
    """One object, or every object of any iterable of them, as Lightning takes `callbacks` and `logger`:
    a list, a tuple, or the ListConfig that Hydra's `instantiate` passes for a list in a config."""
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
        return list(value)
    return [value]


_ALGORITHMS = ("norm", "value")
# Switched off by barebones=True; passing one of them switched on together with it is an error.
_BAREBONES_OFF = {"enable_checkpointing": False, "logger": False, "enable_progress_bar": False,
                  "enable_model_summary": False, "log_every_n_steps": 0, "num_sanity_val_steps": 0}
_DEFAULTS = {"precision": "32-true", "logger": True, "enable_checkpointing": True, "enable_progress_bar": True,
             "enable_model_summary": True, "log_every_n_steps": 50, "num_sanity_val_steps": 2,
             "val_check_interval": 1.0, "limit_train_batches": 1.0, "limit_val_batches": 1.0,
             "limit_test_batches": 1.0, "limit_predict_batches": 1.0, "gradient_clip_algorithm": None}
_UNSUPPORTED = {  # (`plugins`: trainer/checkpoint_plugins.py takes Lightning's AsyncCheckpointIO)
    "model_registry": "upload checkpoints from ModelCheckpoint's dirpath yourself",
}


def defaults_from_env(init: Callable[..., None]) -> Callable[..., None]:
    """Lightning's `PL_TRAINER_<ARG>` environment variables: each replaces that argument's default
    (a value passed explicitly still wins); values are Python literals (`PL_TRAINER_MAX_STEPS=7`,
    `PL_TRAINER_LOGGER=False`), anything else is taken as a string."""
    names = [name for name in inspect.signature(init).parameters if name != "self"]

    @functools.wraps(init)
    def wrapper(self: Any, **kwargs: Any) -> None:
        for name in names:
            raw = os.environ.get(f"PL_TRAINER_{name.upper()}")
            if raw is not None and name not in kwargs:
                try:
                    kwargs[name] = ast.literal_eval(raw)
                except (ValueError, SyntaxError):
                    kwargs[name] = raw
        init(self, **kwargs)

    return wrapper


def resolve_trainer_args(args: dict[str, Any]) -> dict[str, Any]:
    """Validate every argument and return them with Lightning's defaults filled in."""
    resolved = {key: value for key, value in args.items() if key != "self"}
    for name, hint in _UNSUPPORTED.items():
        if resolved[name] not in (None, [], ()):
            raise ValueError(f"Trainer({name}={resolved[name]!r}) is not supported by this Trainer; {hint}.")
    if resolved["barebones"]:
        _apply_barebones(resolved)
    _check_val_schedule(resolved["val_check_interval"], resolved["check_val_every_n_epoch"])
    for name, default in _DEFAULTS.items():
        if resolved[name] is None:
            resolved[name] = default
    resolved["devices"] = 1 if resolved["devices"] == "auto" else resolved["devices"]
    resolved["max_time"] = parse_duration("max_time", resolved["max_time"])
    _apply_fast_dev_run_and_overfit(resolved)
    validate_trainer_args(resolved)
    resolved["num_devices"] = resolved["devices"]  # the Trainer's name for it
    resolved["precision"] = normalize_precision(resolved["precision"])
    default_root_dir = resolved["default_root_dir"]
    resolved["default_root_dir"] = os.path.expanduser(os.fspath(default_root_dir)) if default_root_dir is not None \
        else os.getcwd()
    return resolved


def _apply_barebones(args: dict[str, Any]) -> None:
    for name, off in _BAREBONES_OFF.items():
        value = args[name]
        if value is not None and value is not False and value != 0:
            raise ValueError(f"Trainer(barebones=True, {name}={value!r}): barebones mode switches {name} off (it "
                             "costs speed); drop one of the two.")
        args[name] = off
    for name in ("fast_dev_run", "detect_anomaly"):
        if args[name]:
            raise ValueError(f"Trainer(barebones=True, {name}={args[name]!r}): barebones mode measures raw speed; "
                             f"drop one of the two.")


def _apply_fast_dev_run_and_overfit(args: dict[str, Any]) -> None:
    """fast_dev_run=n runs n batches of each stage; overfit_batches=k trains and validates on the
    same first k batches (a float: that fraction of the batches)."""
    fast = args["fast_dev_run"]
    if fast is not True and fast is not False and (not isinstance(fast, int) or fast < 0):
        raise ValueError(f"fast_dev_run={fast!r} must be True, False or an int >= 0 (a number of batches).")
    overfit = args["overfit_batches"]
    _fraction_or_count(args, "overfit_batches", zero_ok=True, unit="the batches")
    if fast:  # the one home of what fast_dev_run implies
        for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"):
            args[name] = int(fast)
        args.update(fast_dev_run=True if fast == 1 else fast,  # Lightning's: 1 reads True
                    num_sanity_val_steps=0, max_epochs=1, max_steps=int(fast), val_check_interval=1.0,
                    log_every_n_steps=1)
    elif overfit:
        args["limit_train_batches"] = args["limit_val_batches"] = overfit


def parse_duration(name: str, value: Any) -> timedelta | None:
    """Lightning's duration forms: "DD:HH:MM:SS", a timedelta, or a dict of timedelta's arguments."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, dict):
        try:
            return timedelta(**value)
        except TypeError as error:
            raise ValueError(f"{name}={value!r}: {error}; use keys such as days, hours, minutes, seconds.") from None
    if isinstance(value, str):
        match = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", value.strip())
        if match:
            days, hours, minutes, seconds = (int(part) for part in match.groups())
            return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    raise ValueError(f"{name}={value!r}; expected 'DD:HH:MM:SS' (e.g. '00:12:00:00'), a datetime.timedelta or a "
                     "dict such as {'hours': 12}.")


def apply_backend_flags(deterministic: bool | str | None, benchmark: bool | None) -> None:
    """Lightning's meaning: `benchmark=None` leaves cuDNN's autotuner as it is unless `deterministic`
    asks for reproducibility (then it is switched off); `deterministic=True` (or "warn") makes torch
    pick deterministic kernels (erroring, or warning, where none exists)."""
    if deterministic not in (None, True, False, "warn"):
        raise ValueError(f"deterministic={deterministic!r}; expected None, True, False or 'warn'.")
    if benchmark is not None and not isinstance(benchmark, bool):
        raise TypeError(f"benchmark={benchmark!r}; expected None, True or False.")
    if benchmark is None:
        benchmark = False if deterministic else torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=deterministic == "warn")


def validate_trainer_args(args: dict[str, Any]) -> None:
    """Each message reads `name=value must be ...`, so the CLI only prefixes `trainer.` to name the key."""
    for name in ("devices", "num_nodes", "accumulate_grad_batches"):
        _int_at_least(args, name, 1)
    _int_at_least(args, "log_every_n_steps", 0, meaning="0: never")
    normalize_precision(args["precision"])
    _int_at_least(args, "max_epochs", -1, optional=True, meaning="-1: no limit")
    _int_at_least(args, "max_steps", -1, meaning="-1: no limit")
    clip = args["gradient_clip_val"]
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        raise ValueError(f"gradient_clip_val={clip!r} must be None or a number >= 0.")
    _one_of(args, "gradient_clip_algorithm", (None, *_ALGORITHMS))
    _fraction_or_count(args, "val_check_interval", zero_ok=False, unit="an epoch")
    _int_at_least(args, "check_val_every_n_epoch", 1, optional=True)
    for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"):
        _fraction_or_count(args, name, zero_ok=True, unit="the batches")
    _one_of(args, "on_nonfinite", ("error", "skip", "ignore"))
    for name in ("min_epochs", "min_steps"):
        _int_at_least(args, name, 0, optional=True)
    _int_at_least(args, "num_sanity_val_steps", -1, meaning="-1: every batch, 0: off")
    _int_at_least(args, "reload_dataloaders_every_n_epochs", 0)


def _int_at_least(args: dict[str, Any], name: str, minimum: int, optional: bool = False, meaning: str = "") -> None:
    value = args[name]
    if value is None and optional:
        return
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int or value < minimum:
        allowed = f"an int >= {minimum}" + (" or None" if optional else "") + (f" ({meaning})" if meaning else "")
        raise (ValueError if is_int else TypeError)(f"{name}={value!r} must be {allowed}.")


def _one_of(args: dict[str, Any], name: str, allowed: tuple[Any, ...]) -> None:
    if args[name] not in allowed:
        raise ValueError(f"{name}={args[name]!r} is not one of {list(allowed)}.")


def _fraction_or_count(args: dict[str, Any], name: str, zero_ok: bool, unit: str) -> None:
    """Lightning's limits and intervals: a float is a fraction of `unit`, an int a number of batches."""
    value = args[name]
    low = 0 if zero_ok else 1
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if numeric and isinstance(value, int):
        ok = value >= low
    else:
        ok = numeric and (0.0 <= value <= 1.0 if zero_ok else 0.0 < value <= 1.0)
    if not ok:
        fraction = "[0.0, 1.0]" if zero_ok else "(0.0, 1.0]"
        allowed = f"a float in {fraction} (a fraction of {unit}) or an int >= {low} (a number of batches)"
        raise (ValueError if numeric else TypeError)(f"{name}={value!r} must be {allowed}.")


def _check_val_schedule(interval: Any, every_n_epochs: Any) -> None:
    """Lightning's rule, on the values as passed (the default interval, None, is allowed): without
    epochs to validate by, the interval counts training batches across epochs, so a fraction of an
    epoch means nothing there."""
    if every_n_epochs is None and isinstance(interval, float):
        raise ValueError(f"val_check_interval={interval} is a fraction of an epoch, but check_val_every_n_epoch=None "
                         "validates every N training batches counted across epochs: pass an int number of batches "
                         "(e.g. val_check_interval=100), or set check_val_every_n_epoch to validate by epochs.")
