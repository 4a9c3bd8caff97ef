"""Config schemas for `conf/` (registered in Hydra's ConfigStore) and the checks types can't express.

A group file opts into its schema through its defaults list (`- base_trainer`), so Hydra
type-checks every value and rejects unknown keys while composing: `trainer.max_epochs=abc`
fails before anything is built. `validate(cfg)` then runs the checks the Trainer's and the
strategy's constructors own on the composed values, plus what only the whole config shows, and
raises `ConfigError`, whose message is one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import socket
import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import torch

from strategies import DDPStrategy, SingleDeviceStrategy
from strategies.base import resolve_accelerator
from strategies.environment import (SLURM_INTERACTIVE_JOB_NAMES, LocalEnvironment, SLURMEnvironment,
                                    TorchElasticEnvironment)
from strategies.slurm_requeue import slurm_job_id
from trainer.cli.strategy_schema import strategy_schema
from trainer.trainer import Trainer
from trainer.validation import resolve_trainer_args

MONITOR_MODES = ("min", "max")
# What `Trainer()` takes when the config leaves an argument out (the CLI passes only trainer.* keys).
_TRAINER_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(Trainer).parameters.items()}
SINGLE_STRATEGY_TARGETS = ("strategies.SingleDeviceStrategy", "strategies.single_device.SingleDeviceStrategy")


class ConfigError(ValueError):
    """A composed config holds a value the job can't run with; the message is one line
    naming the key, the value and what is allowed (or, with `value` omitted, what went wrong)."""

    _NO_VALUE: Any = object()

    def __init__(self, key: str, value: Any = _NO_VALUE, expected: str = "", joined: str = ": ") -> None:
        self.key, self.value, self.expected = key, value, expected
        text = f"{key}={value!r} {expected}" if value is not self._NO_VALUE else f"{key}{joined}{expected}"
        super().__init__(" ".join(line.strip() for line in text.splitlines()))  # always one line


# Optional[...] rather than `X | None`: OmegaConf reads these annotations at runtime.
@dataclass
class TrainerConfig:
    """`Trainer(...)` keyword arguments; the CLI adds strategy, callbacks, logger, default_root_dir."""

    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    precision: str = "32-true"
    max_epochs: Optional[int] = None
    max_steps: int = -1
    accumulate_grad_batches: int = 1
    gradient_clip_val: Optional[float] = None
    gradient_clip_algorithm: str = "norm"
    val_check_interval: Any = None  # None (once per epoch), a float fraction of an epoch or an int batch count
    check_val_every_n_epoch: Optional[int] = 1
    limit_train_batches: Any = 1.0  # float fraction or int count (likewise below)
    limit_val_batches: Any = 1.0
    limit_test_batches: Any = 1.0
    limit_predict_batches: Any = 1.0
    log_every_n_steps: int = 50
    enable_progress_bar: bool = True
    enable_checkpointing: bool = True
    enable_model_summary: bool = True
    enable_telemetry: bool = True
    deterministic: bool = False
    fast_dev_run: Any = False  # bool or int number of batches
    num_sanity_val_steps: int = 2  # Lightning's default; 0 turns the check off
    use_distributed_sampler: bool = True
    benchmark: Optional[bool] = None


@dataclass
class DigitsDataConfig:
    _target_: str = "trainer.demos.digits.DigitsDataModule"
    batch_size: int = 64
    val_fraction: float = 0.2
    seed: int = 0
    num_workers: int = 0


@dataclass
class SyntheticDataConfig:
    _target_: str = "trainer.demos.synthetic.SyntheticDataModule"
    task: str = "classification"
    num_samples: int = 4096
    input_dim: int = 32
    num_classes: int = 4
    num_targets: int = 1
    noise: float = 0.1
    val_fraction: float = 0.2
    batch_size: int = 64
    seed: int = 0
    num_workers: int = 0


@dataclass
class TextDataConfig:
    _target_: str = "trainer.demos.text.TextDataModule"
    path: Optional[str] = None
    block_size: int = 64
    batch_size: int = 32
    val_fraction: float = 0.1
    num_workers: int = 0


@dataclass
class OptimizerFields:
    """The optimizer arguments every demo model takes (trainer/demos/common.py)."""

    dropout: float = 0.0
    lr: float = 1e-3
    optimizer: str = "adam"
    weight_decay: float = 0.0
    momentum: float = 0.9
    scheduler: Optional[str] = None


# Model keys left null are filled from the datamodule's attribute of the same name (cli.py).
@dataclass
class DigitsClassifierConfig(OptimizerFields):
    _target_: str = "trainer.demos.digits.DigitsClassifier"
    arch: str = "mlp"
    input_dim: Optional[int] = None
    num_classes: Optional[int] = None
    hidden_sizes: list[int] = field(default_factory=lambda: [256])
    channels: list[int] = field(default_factory=lambda: [16, 32])
    lr: float = 3e-3


@dataclass
class MLPRegressorConfig(OptimizerFields):
    _target_: str = "trainer.demos.synthetic.MLPRegressor"
    input_dim: Optional[int] = None
    num_targets: Optional[int] = None
    hidden_sizes: list[int] = field(default_factory=lambda: [128, 64])


@dataclass
class CharGPTConfig:
    _target_: str = "trainer.demos.char_gpt.CharGPT"
    vocab_size: Optional[int] = None
    block_size: Optional[int] = None
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    lr: float = 3e-3
    optimizer: str = "adamw"
    weight_decay: float = 0.01
    scheduler: Optional[str] = None


SCHEMAS: dict[tuple[str, str], type] = {
    ("trainer", "base_trainer"): TrainerConfig,
    ("strategy", "base_ddp"): strategy_schema(DDPStrategy, "strategies.DDPStrategy"),
    ("strategy", "base_single"): strategy_schema(SingleDeviceStrategy, "strategies.SingleDeviceStrategy"),
    ("data", "base_digits"): DigitsDataConfig,
    ("data", "base_synthetic"): SyntheticDataConfig,
    ("data", "base_text"): TextDataConfig,
    ("model", "base_digits_classifier"): DigitsClassifierConfig,
    ("model", "base_mlp_regressor"): MLPRegressorConfig,
    ("model", "base_char_gpt"): CharGPTConfig,
}


def config_dir() -> str:
    """`conf/`: shipped inside the package as `trainer/conf` (a link to the top-level `conf/`
    in a source checkout, real files in a wheel); the checkout's `conf/` if the link is missing."""
    package = Path(__file__).resolve().parents[1]  # trainer/, above this cli/ package
    packaged = package / "conf"
    if (packaged / "config.yaml").is_file():
        return str(packaged)
    return str(package.parent / "conf")


def register_configs() -> None:
    """Put the schemas into Hydra's ConfigStore and register the `ddp_run_name` resolver
    (idempotent); anything composing `conf/` must import this module first."""
    store = ConfigStore.instance()
    for (group, name), node in SCHEMAS.items():
        store.store(group=group, name=name, node=node)
    OmegaConf.register_new_resolver("ddp_run_name", run_name, replace=True)


def run_name(default: str) -> str:
    """The run directory's name. Under torchrun or srun every rank runs `ddp-train` itself and
    their clocks differ, so the launcher's job id names the directory they all share. A SLURM job
    keeps its id when requeued, so its run directory (and preemption checkpoint) is the same; in a
    batch script the command line names it too (interactive allocations keep the clock's name)."""
    if LocalEnvironment.detect():  # a worker of our own launcher (it never re-runs the CLI)
        return default
    if TorchElasticEnvironment.detect():
        run_id = os.environ["TORCHELASTIC_RUN_ID"]
        if run_id in ("", "none"):  # torchrun without --rdzv-id: one node's ranks share the agent
            run_id = f"{socket.gethostname()}-{os.getppid()}"
        return f"torchrun-{run_id}"
    if SLURMEnvironment.detect():
        step = os.environ.get("SLURM_STEP_ID")
        return f"slurm-{os.environ.get('SLURM_JOB_ID', 'job')}" + (f".{step}" if step else "")
    job = slurm_job_id()
    if job and os.environ.get("SLURM_JOB_NAME") not in SLURM_INTERACTIVE_JOB_NAMES:
        # A batch job whose script runs ddp-train (our launcher starts the ranks): a requeued job runs the
        # same command again and must find its checkpoint; two commands of one job get two directories.
        command = hashlib.sha1(" ".join(sys.argv[1:]).encode()).hexdigest()[:8]
        return f"slurm-{job}-{command}"
    return default


register_configs()


# ---------------------------------------------------------------------- validation
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


def constructor_error(group: str, error: Exception) -> ConfigError:
    """A constructor's error as a one-line ConfigError: a message opening with `name=value` names
    the key `group.name`; any other is prefixed with `group: `."""
    message = str(error).rstrip(".")
    names_an_argument = re.match(r"^\w+=", message) is not None
    return ConfigError(group, expected=message, joined="." if names_an_argument else ": ")


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
