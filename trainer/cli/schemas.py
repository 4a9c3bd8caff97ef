"""The structured configs Hydra checks `conf/` against, registered in its ConfigStore, and where `conf/` is.

A group file opts into its schema through its defaults list (`- base_trainer`), so Hydra
type-checks every value and rejects unknown keys while composing: `trainer.max_epochs=abc`
fails before anything is built. What a type can't express is `trainer.cli.checks`' to check.
The Trainer's, the strategies' and the demo DataModules' schemas are read off their signatures
(signature_schema.py):
their arguments are written once in code and once, with the CLI's values, in `conf/`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from strategies import DDPStrategy, SingleDeviceStrategy
from trainer.cli.run_dir import run_name
from trainer.cli.signature_schema import signature_schema
from trainer.demos.digits import DigitsDataModule
from trainer.demos.synthetic import SyntheticDataModule
from trainer.demos.text import TextDataModule
from trainer.datamodule import LightningDataModule
from trainer.trainer import Trainer


# What the CLI builds itself and hands to `Trainer(...)` (cli/command.py: build); every other Trainer
# argument is a `trainer.*` key.
TRAINER_ARGS_THE_CLI_BUILDS = ("strategy", "callbacks", "logger", "default_root_dir")
# What a strategy's caller passes (the Trainer, from trainer.accelerator), or Python only.
STRATEGY_ARGS_NOT_FROM_THE_CLI = ("accelerator", "checkpoint_io")

TrainerConfig = signature_schema(Trainer.__init__, "TrainerConfig", leave_out=TRAINER_ARGS_THE_CLI_BUILDS)


# Optional[...] rather than `X | None`: OmegaConf reads these annotations at runtime.
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


def _datamodule_schema(datamodule: type[LightningDataModule]) -> type:
    """A demo DataModule's schema, read off its constructor like the Trainer's (every argument is a key)."""
    return signature_schema(datamodule.__init__, f"{datamodule.__name__}Config", leave_out=(),
                            target=f"{datamodule.__module__}.{datamodule.__name__}")


SCHEMAS: dict[tuple[str, str], type] = {
    ("trainer", "base_trainer"): TrainerConfig,
    ("strategy", "base_ddp"): signature_schema(DDPStrategy.__init__, "DDPStrategyConfig",
                                               leave_out=STRATEGY_ARGS_NOT_FROM_THE_CLI,
                                               target="strategies.DDPStrategy"),
    ("strategy", "base_single"): signature_schema(SingleDeviceStrategy.__init__, "SingleDeviceStrategyConfig",
                                                  leave_out=STRATEGY_ARGS_NOT_FROM_THE_CLI,
                                                  target="strategies.SingleDeviceStrategy"),
    **{("data", f"base_{name}"): _datamodule_schema(datamodule) for name, datamodule in
       (("digits", DigitsDataModule), ("synthetic", SyntheticDataModule), ("text", TextDataModule))},
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


register_configs()
