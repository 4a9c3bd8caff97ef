"""A module that asks the strategy what it is (Lightning's ImageNet example's `setup()`: split `batch_size` by
`trainer.strategy.num_processes` when `isinstance(trainer.strategy, ParallelStrategy)`), under Lightning's
Trainer and ours, for programs on either Lightning package (the other hidden), at 1 process (`strategy="auto"`:
a SingleDeviceStrategy, no split) and 2 (`strategy="ddp"`: split). Metrics, weights, the best checkpoint, the
test results and the caller's `model.batch_size` must be Lightning's. The program is
tests/conformance/split_batch_program.py; each run is its own process (Lightning's `ddp` re-runs the script).
`make test` runs the `lightning.pytorch` program at 2 processes; `make conformance` the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(which: str, package: str, processes: int, out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.conformance.split_batch_program", which, package, str(processes), str(out)]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, f"{which}: {done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


@pytest.mark.timeout(540)
@pytest.mark.parametrize(("package", "processes"), [
    pytest.param("lightning.pytorch", 2),
    pytest.param("pytorch_lightning", 2, marks=pytest.mark.conformance),
    pytest.param("lightning.pytorch", 1, marks=pytest.mark.conformance),
    pytest.param("pytorch_lightning", 1, marks=pytest.mark.conformance),
])
@pytest.mark.conformance
def test_a_module_splitting_its_batch_by_parallel_strategy(tmp_path: Path, package: str, processes: int) -> None:
    lightning = _run("lightning", package, processes, tmp_path / "lightning")
    ours = _run("ours", package, processes, tmp_path / "ours")
    assert ours["isinstance"] == lightning["isinstance"]
    assert ours["isinstance"]["ParallelStrategy"] is (processes > 1)
    assert ours["after_fit"].pop("weights") == pytest.approx(lightning["after_fit"].pop("weights"), rel=1e-5, abs=1e-6)
    assert ours["after_fit"].pop("metrics") == pytest.approx(lightning["after_fit"].pop("metrics"), rel=1e-5, abs=1e-6)
    assert ours["after_fit"].pop("best_score") == pytest.approx(lightning["after_fit"].pop("best_score"), rel=1e-5)
    (tested,), (expected,) = ours["after_test"].pop("results"), lightning["after_test"].pop("results")
    assert tested == pytest.approx(expected, rel=1e-5)
    assert ours == lightning  # the rest exactly: batch sizes, steps, the best file, the packages loaded
    expected_batch = 16 // processes ** 2  # fit's setup and test's setup each split (Lightning's own arithmetic)
    assert ours["after_test"]["batch_size"] == expected_batch
    assert ours["loaded"] == [package.partition(".")[0]]
