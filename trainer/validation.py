"""Trainer argument checks: fail in __init__, before any process starts, naming the argument."""

from __future__ import annotations

from typing import Any

from trainer.precision import normalize_precision

_ALGORITHMS = ("norm", "value")


def validate_trainer_args(args: dict[str, Any]) -> None:
    _positive_int(args, "devices")
    _positive_int(args, "num_nodes")
    _positive_int(args, "accumulate_grad_batches")
    _positive_int(args, "log_every_n_steps")
    normalize_precision(args["precision"])
    if args["max_epochs"] is not None:
        _int(args, "max_epochs")
        if args["max_epochs"] < -1:
            raise ValueError(f"max_epochs={args['max_epochs']}; expected -1 (no limit) or a value >= 0.")
    _int(args, "max_steps")
    if args["max_steps"] < -1:
        raise ValueError(f"max_steps={args['max_steps']}; expected -1 (no limit) or a value >= 0.")
    clip = args["gradient_clip_val"]
    if clip is not None and (not isinstance(clip, (int, float)) or clip < 0):
        raise ValueError(f"gradient_clip_val={clip!r}; expected None or a number >= 0.")
    if args["gradient_clip_algorithm"] not in _ALGORITHMS:
        raise ValueError(f"gradient_clip_algorithm={args['gradient_clip_algorithm']!r}; expected one of {_ALGORITHMS}.")
    _check_interval(args["val_check_interval"])
    every = args["check_val_every_n_epoch"]
    if every is not None and (not isinstance(every, int) or every < 1):
        raise ValueError(f"check_val_every_n_epoch={every!r}; expected None or an int >= 1.")
    for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"):
        _check_limit(name, args[name])
    if args["on_nonfinite"] not in ("error", "skip", "ignore"):
        raise ValueError(f"on_nonfinite={args['on_nonfinite']!r}; expected 'error', 'skip' or 'ignore'.")
    fast = args["fast_dev_run"]
    if isinstance(fast, bool) is False and (not isinstance(fast, int) or fast < 0):
        raise ValueError(f"fast_dev_run={fast!r}; expected a bool or an int >= 0.")


def _int(args: dict[str, Any], name: str) -> None:
    value = args[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}); expected an int.")


def _positive_int(args: dict[str, Any], name: str) -> None:
    _int(args, name)
    if args[name] < 1:
        raise ValueError(f"{name}={args[name]}; expected an int >= 1.")


def _check_interval(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"val_check_interval={value!r}; expected a float in (0, 1] or an int >= 1.")
    if isinstance(value, float) and not 0.0 < value <= 1.0:
        raise ValueError(f"val_check_interval={value}; a float must lie in (0, 1] (a fraction of an epoch).")
    if isinstance(value, int) and value < 1:
        raise ValueError(f"val_check_interval={value}; an int must be >= 1 (a number of batches).")


def _check_limit(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r}; expected a float in [0, 1] or an int >= 0.")
    if isinstance(value, float) and not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}={value}; a float must lie in [0, 1] (a fraction of the batches).")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{name}={value}; an int must be >= 0 (a number of batches).")
