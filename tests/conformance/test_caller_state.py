"""The caller-state family: after every stage of a 2-process `ddp` run, the calling process holds
what it holds under Lightning's `ddp` (rank 0 runs there in both): logger files, callback and module
attributes, `trainer.optimizers`, ModelCheckpoint's fields, the metrics dicts (a dict kept from
`fit()` too), one random draw of each generator, and the weights.

The program is tests/conformance/caller_state_script.py, unchanged between the Trainers; each run is
a script in its own process, since Lightning's `ddp` starts rank 1 by running the command line again.
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
TOLERANCE = 1e-5  # relative: the ranks' gradients are averaged by two reducers (summation order)


def _run(trainer: str, objects: str, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "tests.conformance.caller_state_script", trainer, objects, str(out)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    snapshots: dict[str, Any] = json.loads(Path(out, "caller.json").read_text())
    return snapshots


def _differences(lightning: Any, ours: Any, path: str = "") -> list[str]:
    if isinstance(lightning, dict) and isinstance(ours, dict):
        found = []
        for key in sorted(set(lightning) | set(ours)):
            found += _differences(lightning.get(key, "<missing>"), ours.get(key, "<missing>"), f"{path}.{key}")
        return found
    if isinstance(lightning, list) and isinstance(ours, list) and len(lightning) == len(ours):
        return [d for i, (a, b) in enumerate(zip(lightning, ours)) for d in _differences(a, b, f"{path}[{i}]")]
    if isinstance(lightning, (int, float)) and isinstance(ours, (int, float)) and not isinstance(lightning, bool):
        close = abs(lightning - ours) <= TOLERANCE * max(1.0, abs(lightning))
        return [] if close else [f"{path}: Lightning {lightning}, ours {ours}"]
    if isinstance(lightning, str) and isinstance(ours, str):  # CSV cells are text
        try:
            return _differences(float(lightning), float(ours), path)
        except ValueError:
            pass
    return [] if lightning == ours else [f"{path}: Lightning {lightning!r}, ours {ours!r}"]


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run("lightning", "lightning", tmp_path_factory.mktemp("lightning"))


@pytest.mark.conformance
@pytest.mark.timeout(600)
@pytest.mark.parametrize("objects", ["lightning", "ours"])
def test_the_caller_holds_what_ran_after_every_stage(objects: str, lightning_run: dict[str, Any],
                                                      tmp_path: Path) -> None:
    """Lightning's callbacks and logger, and ours, under our Trainer against Lightning's under its own."""
    ours = _run("ours", objects, tmp_path / "ours")
    differences = _differences(lightning_run, ours)
    assert not differences, "\n".join(differences[:40])


@pytest.mark.timeout(300)
def test_the_caller_holds_what_ran_after_every_stage_quick(tmp_path: Path) -> None:
    """The representative part `make test` runs: our Trainer with Lightning's objects, against values
    Lightning's `ddp` itself gives for the same script (the structure is compared in full; the slow
    run above compares every value against a fresh Lightning run)."""
    ours = _run("ours", "lightning", tmp_path / "ours")
    fit, test = ours["fit"], ours["test"]
    # The objects the script holds ran: counters, attributes, optimizers, checkpoint fields.
    assert fit["callback"] == {"batches": 8, "val_ends": 3, "fit_ended": True, "stages": ["fit"]}
    assert fit["module"]["fit_ends"] == 1 and fit["module"]["has_lr_scheduler"] and fit["module"]["attached"]
    assert fit["trainer"]["optimizers"] == ["SGD"] and fit["trainer"]["schedulers"] == 1
    assert fit["trainer"]["lrs"] == [0.025] and fit["trainer"]["lightning_module"]
    assert fit["checkpoint"]["best_model_score"] == pytest.approx(fit["metrics"]["callback"]["val_loss"])
    assert fit["checkpoint"]["last_model_path"] == "logs/version_0/checkpoints/last.ckpt"
    # Every stage appends to the one metrics.csv; a dict kept from fit keeps the fit's values.
    assert [sorted(row) for row in test["csv_rows"][-2:]] == [["epoch", "step", "val_loss"],
                                                               ["epoch", "step", "test_loss"]]
    assert len(test["csv_rows"]) == len(fit["csv_rows"]) + 2
    assert test["metrics"]["kept_from_fit"] == fit["metrics"]["callback"]
    assert set(test["metrics"]["callback"]) == {"test_loss"}
    assert ours["fit_again"]["callback"]["stages"] == ["fit", "validate", "test", "predict", "fit"]
    assert ours["fit_again"]["module"]["fit_ends"] == 2
    # Every stage of a seeded DDP run starts from the seed on every rank (Lightning's rule), so the
    # caller's draws after each evaluation stage are the same.
    assert ours["validate"]["random"] == ours["test"]["random"] == ours["predict"]["random"]
