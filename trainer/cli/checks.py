"""The checks a composed `ddp-train` config gets before any worker starts, beyond what the schemas'
types express: each value with its consumer's own check (the Trainer's and the strategy's), and the
combinations only the whole config shows. Every failure is a one-line `ConfigError` naming the key.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from strategies.base import resolve_accelerator
from trainer.cli.errors import ConfigError, constructor_error
from trainer.trainer import Trainer
from trainer.validation import resolve_trainer_args

MONITOR_MODES = ("min", "max")
# What `Trainer()` takes when the config leaves an argument out (the CLI passes only trainer.* keys).
_TRAINER_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(Trainer).parameters.items()}
SINGLE_STRATEGY_TARGETS = ("strategies.SingleDeviceStrategy", "strategies.single_device.SingleDeviceStrategy")


def validate(cfg: DictConfig) -> None:
    """Check, before any worker starts, what the schemas can't: each value with its consumer's own
    check (the Trainer's and the strategy's constructors), and the combinations only the composed
    config shows."""
    _check_int(cfg, "seed", minimum=0, maximum=2**32 - 1)
    _check_trainer(cfg.trainer)
    _check_strategy(cfg.strategy, cfg.trainer)
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
    """A missing checkpoint is a typo to report now, not after the workers started."""
    if ckpt_path is None or ckpt_path == "last":
        return
    if not os.path.isfile(str(ckpt_path)):
        raise ConfigError("ckpt_path", ckpt_path, "is not a file; pass an existing checkpoint, 'last' or null")


def _check_trainer(trainer: DictConfig) -> None:
    """The Trainer's own argument checks (trainer/validation.py) and the strategy's accelerator
    check, on the config's values; then what needs this machine: enough CUDA devices."""
    try:
        resolve_trainer_args({**_TRAINER_DEFAULTS, **OmegaConf.to_container(trainer, resolve=True)})  # type: ignore[dict-item]
        resolve_accelerator(trainer.accelerator)
    except (ValueError, TypeError, RuntimeError) as error:
        raise constructor_error("trainer", error) from error
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if trainer.accelerator != "cpu" and available and trainer.devices > available:
        raise ConfigError("trainer.devices", trainer.devices,
                          f"exceeds the {available} visible CUDA device(s); lower it or use trainer.accelerator=cpu")


def _check_strategy(strategy: Any, trainer: DictConfig) -> None:
    """What needs the whole config (the Trainer's world and device); every other value is the
    constructor's to check (`_build_to_check`)."""
    if not isinstance(strategy, DictConfig):
        return
    world = trainer.devices * trainer.num_nodes
    if strategy.get("_target_") in SINGLE_STRATEGY_TARGETS and world != 1:
        raise ConfigError("trainer.devices", trainer.devices,
                          f"(x num_nodes={trainer.num_nodes}) must be 1 with strategy=single; "
                          "use strategy=ddp for more processes")
    if strategy.get("sync_batchnorm") and trainer.accelerator == "cpu":
        raise ConfigError("strategy.sync_batchnorm", True, "needs trainer.accelerator=cuda (SyncBatchNorm has no CPU "
                                                           "kernel); set it to false")
    _build_to_check(strategy)


def _build_to_check(strategy: DictConfig) -> None:
    """Build the strategy once (its `__init__` only checks and stores) so a bad value fails here,
    before the run directory exists, with the constructor's own message naming the argument."""
    if not _has_target(strategy):
        return
    try:
        instantiate(strategy, _convert_="all")
    except InstantiationException as error:
        if not isinstance(error.__cause__, (ValueError, TypeError)):
            raise
        raise constructor_error("strategy", error.__cause__) from error.__cause__


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
