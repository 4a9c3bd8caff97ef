"""Samplers of every stage and what a program reads back, against Lightning (issue #38, items 3 and 4).

The program is tests/conformance/data_stages_script.py, unchanged between the Trainers and run as a script
(Lightning's `ddp` re-runs the command line for rank 1), under `lightning.pytorch` and `pytorch_lightning`,
at 1 and 2 processes. Compared with Lightning's own run: what every rank's steps saw (a `WeightedRandomSampler`
in fit and test, a shuffling loader and a weighted one in predict: sample ids in order, `is_last_batch`, also on
a stream without a length), the predictions the caller gets and their order, the caller's torch random state
after each stage (fit, test, both predicts, a fit with nothing left to train, a fresh fit on the stream), the
keys of `progress_bar_metrics`/`callback_metrics`/`logged_metrics` (only what the program logged), and the
files of the logger's version folder (TensorBoard's `hparams.yaml`, CSV's `metrics.csv`).

`make test` runs one representative (`lightning.pytorch`, 1 process, TensorBoard); the others are marked
`conformance` (each 2-process pair takes minutes on a loaded 2-core machine).
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


def _run(trainer: str, package: str, devices: int, logger: str, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "tests.conformance.data_stages_script", trainer, str(devices), logger,
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONPATH": str(REPO), "DATA_STAGES_PACKAGE": package})
    assert done.returncode == 0, f"{trainer} failed:\n{done.stderr[-4000:]}"
    record: dict[str, Any] = json.loads(Path(out, "caller.json").read_text())
    record["ranks"] = {rank: [json.loads(line) for line in Path(out, f"rank{rank}.jsonl").read_text().splitlines()]
                       for rank in range(devices)}
    record["stdout_telemetry"] = [line for line in done.stdout.splitlines() if line.startswith("telemetry:")]
    return record


def _differences(lightning: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    found = []
    for key in sorted(set(lightning) | set(ours)):
        if key == "ranks":
            for rank, steps in lightning["ranks"].items():
                other = ours["ranks"].get(rank, [])
                for index, (a, b) in enumerate(zip(steps, other)):
                    if a != b:
                        found.append(f"rank {rank} step record {index}: Lightning {a}, ours {b}")
                if len(steps) != len(other):
                    found.append(f"rank {rank}: Lightning {len(steps)} step records, ours {len(other)}")
        elif lightning.get(key) != ours.get(key):
            found.append(f"{key}: Lightning {lightning.get(key)}, ours {ours.get(key)}")
    return found


def _compare(package: str, devices: int, logger: str, tmp_path: Path) -> dict[str, Any]:
    lightning = _run("lightning", package, devices, logger, tmp_path / "lightning")
    ours = _run("ours", package, devices, logger, tmp_path / "ours")
    differences = _differences(lightning, ours)
    assert not differences, "\n".join(differences[:30])
    return ours


def _check_what_the_program_reads(record: dict[str, Any], devices: int, logger: str) -> None:
    """Values beyond the comparison, so a change that broke both Trainers alike would still show."""
    assert record["keys"]["progress_bar_metrics"] == ["train_loss"]  # no telemetry keys
    assert record["stdout_telemetry"] == []  # the fit-end line only when asked
    expected_file = "hparams.yaml" if logger == "tensorboard" else "metrics.csv"
    assert expected_file in record["logger_files"]
    random = record["random"]
    assert random["fit_again"] != random["predict_weighted"]  # the fit with nothing to train still drew
    stream = [step for step in record["ranks"][0] if step["stage"] == "fit"][-3:]  # the last fit: the stream's
    assert [(step["ids"], step["is_last_batch"]) for step in stream] == [
        ([0, 1, 2, 3], False), ([4, 5, 6, 7], False), ([8, 9], True)]  # known for a loader without a length
    predicted = [i for rank in record["ranks"].values() for step in rank if step["stage"] == "predict"
                 for i in step["ids"]]
    assert len(predicted) == 2 * 24  # two predict stages of 24 draws, each draw on exactly one rank
    if devices > 1:
        first_predict = [step for step in record["ranks"][0] if step["stage"] == "predict"][:3]
        other_predict = [step for step in record["ranks"][1] if step["stage"] == "predict"][:3]
        shuffled = [i for step in first_predict + other_predict for i in step["ids"]]
        assert sorted(shuffled) == list(range(24))  # the shuffling loader's order, split without repeats


@pytest.mark.timeout(600)
@pytest.mark.conformance
def test_data_stages_match_lightning_quick(tmp_path: Path) -> None:
    """The representative `make test` runs: `lightning.pytorch`, 1 process, TensorBoardLogger."""
    _check_what_the_program_reads(_compare("lightning.pytorch", 1, "tensorboard", tmp_path), 1, "tensorboard")


@pytest.mark.conformance
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("package", "devices", "logger"), [
    ("pytorch_lightning", 1, "csv"),
    ("lightning.pytorch", 2, "tensorboard"),
    ("pytorch_lightning", 2, "csv"),
    ("pytorch_lightning", 2, "tensorboard"),
    ("lightning.pytorch", 2, "csv"),
])
def test_data_stages_match_lightning(package: str, devices: int, logger: str, tmp_path: Path) -> None:
    _check_what_the_program_reads(_compare(package, devices, logger, tmp_path), devices, logger)
