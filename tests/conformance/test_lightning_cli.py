"""LightningCLI programs under Lightning's CLI and ours (`from trainer.lightning_cli import LightningCLI`):
the same command lines and YAML files end in the same results, for programs written against either of
Lightning's packages (`lightning.pytorch`, `pytorch_lightning`), each run with the *other* package hidden
(as if not installed: the program needs only its own). `make test` runs the YAML one under
`pytorch_lightning` and the CLI subclass under `lightning.pytorch`; `make conformance` the rest. The program is
tests/conformance/lightning_cli_program.py, unchanged between the two CLIs; each run is its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# The package a program is written against -> the one hidden from it.
OTHER = {"lightning.pytorch": "pytorch_lightning", "pytorch_lightning": "lightning"}
TRAINER_MODULE = {"lightning.pytorch": "lightning", "pytorch_lightning": "pytorch_lightning"}
QUIET = ["--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def _run(which: str, mode: str, arguments: list[str], root: Path, package: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.conformance.lightning_cli_program", which, mode, *arguments]
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLI_RESULTS": str(root), "CLI_PACKAGE": package,
           "CLI_HIDE": OTHER[package]}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{which}: {done.stderr[-3000:]}"
    result = json.loads((root / "rank0.json").read_text())  # the launching process's
    result.pop("rank")
    result["log_dir"] = os.path.relpath(result["log_dir"], root) if result["log_dir"] else None
    return result


def _both(mode: str, arguments: list[str], tmp_path: Path,
          package: str = "pytorch_lightning") -> tuple[dict[str, Any], dict[str, Any]]:
    runs = []
    for which in ("lightning", "ours"):
        root = tmp_path / which
        runs.append(_run(which, mode, [*arguments, f"--trainer.default_root_dir={root}"], root, package))
    lightning, ours = runs
    assert (lightning.pop("trainer"), ours.pop("trainer")) == (TRAINER_MODULE[package], "trainer")
    assert ours["loaded"] == lightning["loaded"] == [package.partition(".")[0]]  # the other was never needed
    return lightning, ours


BOTH_SLOW = [pytest.param(package, marks=pytest.mark.conformance) for package in OTHER]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("package", ["pytorch_lightning", pytest.param("lightning.pytorch", marks=pytest.mark.conformance)])
@pytest.mark.conformance
def test_flags_and_a_yaml_config_give_what_lightnings_cli_gives(tmp_path: Path, package: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("trainer:\n  max_epochs: 2\n  limit_val_batches: 2\nmodel:\n  hidden: 5\ndata:\n  batch_size: 8\n")
    lightning, ours = _both("cli", ["fit", f"--config={config}", "--model.lr=0.05", "--trainer.devices=1", *QUIET],
                            tmp_path, package)
    assert ours == lightning
    assert ours["global_step"] == 8 and ours["hparams"]["hidden"] == 5 and ours["hparams"]["lr"] == 0.05
    saved = tmp_path / "ours" / ours["log_dir"] / "config.yaml"  # SaveConfigCallback wrote the full config
    assert "hidden: 5" in saved.read_text() and "max_epochs: 2" in saved.read_text()


@pytest.mark.timeout(540)
@pytest.mark.parametrize("package", ["lightning.pytorch", pytest.param("pytorch_lightning", marks=pytest.mark.conformance)])
@pytest.mark.conformance
def test_a_cli_subclass_with_its_own_save_config_callback_and_trainer_defaults(tmp_path: Path, package: str) -> None:
    """The issue's program: `lightning.pytorch` classes, a LightningCLI subclass (linked arguments, before_fit),
    a SaveConfigCallback subclass, a Lightning callback in trainer_defaults; `pytorch_lightning` not installed."""
    fit = ["fit", "--trainer.max_epochs=1", "--trainer.devices=1", "--data.features=3", *QUIET]
    lightning, ours = _both("subclass", fit, tmp_path, package)
    assert ours == lightning and ours["before_fit"] and ours["hparams"]["features"] == 3  # linked data -> model
    assert ours["config_saved_in"] == "fit" and ours["early_stopping"] == [TRAINER_MODULE[package]]
    assert (tmp_path / "ours" / ours["log_dir"] / "config.yaml").is_file()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("package", BOTH_SLOW)
def test_test_subcommand_from_a_checkpoint_and_a_subclass_with_linked_arguments(tmp_path: Path, package: str) -> None:
    fit = ["fit", "--trainer.max_epochs=1", "--trainer.devices=1", "--data.features=3", *QUIET]
    lightning, ours = _both("subclass", fit, tmp_path / "fit", package)
    assert ours == lightning and ours["before_fit"] and ours["hparams"]["features"] == 3  # linked data -> model
    checkpoint = next((tmp_path / "fit" / "ours").rglob("*.ckpt"))
    test = ["test", f"--ckpt_path={checkpoint}", "--trainer.devices=1", "--data.features=3", *QUIET]
    lightning, ours = _both("subclass", test, tmp_path / "test", package)
    assert ours == lightning and "test_loss" in ours["metrics"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("package", BOTH_SLOW)
def test_run_false_leaves_the_program_to_call_the_trainer(tmp_path: Path, package: str) -> None:
    lightning, ours = _both("no_run", ["--trainer.max_epochs=1", "--trainer.devices=1", *QUIET], tmp_path, package)
    assert ours == lightning and ours["outputs"][0]["test_loss"] > 0


@pytest.mark.timeout(420)
@pytest.mark.parametrize("mode", ["cli", "subclass"])
@pytest.mark.parametrize("package", BOTH_SLOW)
def test_two_processes_under_both_clis(tmp_path: Path, package: str, mode: str) -> None:
    """Lightning's `ddp` against ours, 2 CPU processes: rank 0 is the CLI's own process in both."""
    arguments = ["fit", "--trainer.max_epochs=2", "--trainer.devices=2", "--trainer.strategy=ddp", *QUIET]
    lightning, ours = _both(mode, arguments, tmp_path, package)
    assert ours.pop("weights") == pytest.approx(lightning.pop("weights"), abs=1e-4)
    assert ours.pop("metrics") == pytest.approx(lightning.pop("metrics"), abs=1e-4)
    assert ours == lightning and ours["global_step"] == 8
