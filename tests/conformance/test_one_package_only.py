"""A program on one Lightning package runs with the other one hidden (as if never installed): our Trainer with
that package's callbacks (a BaseFinetuning subclass among them), logger, profiler and DataModule, the
module's `load_from_checkpoint` on our checkpoint, and our reducer plugged into that package's own Trainer.
The program is tests/conformance/one_package_program.py, each run its own process. `make test` runs each
package at 1 process; `make conformance` at 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(660)
@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.conformance)])
@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
@pytest.mark.conformance
def test_a_program_needs_only_its_own_lightning_package(tmp_path: Path, package: str, processes: int) -> None:
    ours, plugin = (_run(what, package, processes, tmp_path) for what in ("ours", "plugin"))
    assert ours["loaded"] == plugin["loaded"] == [package.partition(".")[0]]
    assert ours["global_step"] == 16 // processes and plugin["global_step"] == 8 // processes
    assert ours["best_reloads_equal"] and ours["reloaded_hparams"] == {"hidden": 8}
    assert ours["metrics_file"] and ours["strategy_is_lightnings"]
    assert plugin["strategy"] == "LightningDDPStrategy" and plugin["strategy_base"].startswith(package)


def _run(what: str, package: str, processes: int, out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.conformance.one_package_program", what, package, str(processes), str(out)]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{what}: {done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads((out / f"{what}.json").read_text())
    return result
