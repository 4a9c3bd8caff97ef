"""The checks a composed `ddp-train` config gets before any worker starts, beyond what the schemas'
types express: each value with its consumer's own check (the Trainer's and the strategy's), and the
combinations only the whole config shows. Every failure is a one-line `ConfigError` naming the key.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from strategies import Strategy
from strategies.base import resolve_accelerator
from strategies.checkpoint_io import CheckpointError
from trainer.assembly import build_strategy
from trainer.checkpointing import require_checkpoint_file
from trainer.cli.errors import ConfigError, constructor_error
from trainer.trainer import Trainer
from trainer.validation import resolve_trainer_args

MONITOR_MODES = ("min", "max")
# What `Trainer()` takes when the config leaves an argument out (the CLI passes only trainer.* keys).
_TRAINER_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(Trainer).parameters.items()}


def validate(cfg: DictConfig) -> None:
    """Check, before any worker starts, what the schemas can't: each value with its consumer's own
    check (the Trainer's and the strategy's constructors), and the combinations only the composed
    config shows."""
    _check_int(cfg, "seed", minimum=0, maximum=2**32 - 1)
    trainer_args = _check_trainer(cfg.trainer)
    _check_strategy(cfg.strategy, trainer_args)
    _check_one_of(cfg, "monitor.mode", MONITOR_MODES)
    _check_ckpt_path(cfg.get("ckpt_path"))
    for group in ("model", "data", "strategy"):
        if not _has_target(cfg.get(group)):
            raise ConfigError(group, _plain(cfg.get(group)), "needs a `_target_` naming the class to build")
    for group in ("callbacks", "logger"):
        for name, node in (cfg.get(group) or {}).items():
            if node is not None and not _has_target(node):
                raise ConfigError(f"{group}.{name}", _plain(node), "needs a `_target_` (or null to disable it)")


def _check_ckpt_path(ckpt_path: Any) -> None:
    """A missing checkpoint is a typo to report now, not after the workers started: the Trainer's own
    check, with "last" the one keyword a command line resumes from."""
    try:
        require_checkpoint_file(None if ckpt_path is None else str(ckpt_path), keywords=("last",))
    except CheckpointError as error:
        raise constructor_error("", error) from error


def _check_trainer(trainer: DictConfig) -> dict[str, Any]:
    """The Trainer's own argument checks (trainer/validation.py) and the strategy's accelerator
    check, on the config's values; then what needs this machine: enough CUDA devices. Returns the
    arguments as the Trainer resolves them (`devices="auto"` is 1, ...)."""
    try:
        args = resolve_trainer_args({**_TRAINER_DEFAULTS, **OmegaConf.to_container(trainer, resolve=True)})  # type: ignore[dict-item]
        resolve_accelerator(args["accelerator"])
    except (ValueError, TypeError, RuntimeError) as error:
        raise constructor_error("trainer", error) from error
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args["accelerator"] != "cpu" and available and args["devices"] > available:
        raise ConfigError("trainer.devices", args["devices"],
                          f"exceeds the {available} visible CUDA device(s); lower it or use trainer.accelerator=cpu")
    return args


def _check_strategy(strategy: Any, trainer_args: dict[str, Any]) -> None:
    """Build the strategy and hand it the Trainer's world as `Trainer(...)` would, on a throwaway
    instance: the constructor checks each value, `configure` what needs the world (one device means
    one process, sync_batchnorm needs CUDA), and their own messages name the argument. Something
    that is not a Strategy is the Trainer's to reject, when `build` constructs it."""
    if not _has_target(strategy):
        return
    built = _build_to_check(strategy)
    if not isinstance(built, Strategy):
        return
    try:
        build_strategy({**trainer_args, "strategy": built})  # exactly as Trainer(...) builds it
    except (ValueError, TypeError, RuntimeError) as error:
        raise constructor_error("strategy", error) from error


def _build_to_check(strategy: DictConfig) -> Any:
    """Build the strategy once (its `__init__` only checks and stores) so a bad value fails here,
    before the run directory exists, with the constructor's own message naming the argument."""
    try:
        built = instantiate(strategy, _convert_="all")
    except InstantiationException as error:
        if not isinstance(error.__cause__, (ValueError, TypeError)):
            raise
        raise constructor_error("strategy", error.__cause__) from error.__cause__
    return built


def _check_int(node: DictConfig, key: str, minimum: int, maximum: int) -> None:
    value = OmegaConf.select(node, key)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(key, value, f"must be an int >= {minimum} and <= {maximum}")


def _check_one_of(node: DictConfig, key: str, allowed: tuple[Any, ...]) -> None:
    value = OmegaConf.select(node, key)
    if value not in allowed:
        raise ConfigError(key, value, f"is not one of {list(allowed)}")


def _has_target(node: Any) -> bool:
    return isinstance(node, DictConfig) and "_target_" in node


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else node
