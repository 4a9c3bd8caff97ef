"""The Trainer's arguments are written once in code (its signature) and once in conf/trainer/ (the
CLI's values and comments); the schema Hydra checks against is generated from the first. These tests
fail as soon as the three drift apart."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from trainer import Trainer
from trainer.cli.schemas import TRAINER_ARGS_THE_CLI_BUILDS, TrainerConfig, config_dir
from trainer.validation import resolve_trainer_args

SIGNATURE = {name: parameter.default for name, parameter in inspect.signature(Trainer).parameters.items()}
SCHEMA = {schema_field.name: schema_field.default for schema_field in dataclasses.fields(TrainerConfig)}
# default.yaml's values that are deliberately not Trainer()'s: a demo run of two CPU processes for ten
# epochs, logging often; "norm" named (Trainer's None also clips by norm, but lets a module's
# clip_gradients pick another algorithm); `false` written out (None and False both leave torch's flags).
THE_CLIS_CHOICES = {"accelerator", "devices", "max_epochs", "log_every_n_steps", "gradient_clip_algorithm",
                    "deterministic"}


def trainer_yaml(name: str) -> dict[str, Any]:
    values: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(Path(config_dir(), "trainer", f"{name}.yaml")))  # type: ignore[assignment]
    values.pop("defaults", None)
    return values


def test_the_schema_is_the_signature_less_what_the_cli_builds() -> None:
    assert set(SCHEMA) == set(SIGNATURE) - set(TRAINER_ARGS_THE_CLI_BUILDS)
    assert SCHEMA == {name: SIGNATURE[name] for name in SCHEMA}, "a schema default differs from Trainer()'s"


@pytest.mark.parametrize("preset", ["default", "fast"])
def test_every_yaml_key_is_a_trainer_argument(preset: str) -> None:
    assert set(trainer_yaml(preset)) - set(SCHEMA) == set(), f"conf/trainer/{preset}.yaml has keys Trainer lacks"


def test_the_yaml_lists_every_argument_the_cli_may_set() -> None:
    assert set(SCHEMA) - set(trainer_yaml("default")) == set(), "conf/trainer/default.yaml lacks these"


def test_the_yaml_defaults_are_the_trainers_but_for_the_clis_choices() -> None:
    """Compared as the Trainer resolves them: `precision: 32-true` is what its None means."""
    written = trainer_yaml("default")
    assert THE_CLIS_CHOICES <= set(written)
    own = resolve_trainer_args(dict(SIGNATURE))
    from_yaml = resolve_trainer_args({**SIGNATURE, **written})
    drifted = {name: (written[name], SIGNATURE[name]) for name in written.keys() & SCHEMA.keys()
               if from_yaml[name] != own[name] and name not in THE_CLIS_CHOICES}
    assert drifted == {}, "conf/trainer/default.yaml (value, Trainer's default) differ"
