"""Every corpus case at 1 process: Lightning's Trainer is the oracle for ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.compare import assert_conformant, compare, run_case, run_one
from tests.conformance.cases import CASES


def _params() -> list[object]:
    return [pytest.param(name, marks=() if case.fast else pytest.mark.conformance, id=name)
            for name, case in CASES.items()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", _params())
def test_case_conforms_at_one_process(name: str, tmp_path: Path) -> None:
    lightning, ours = run_case(CASES[name], tmp_path, processes=1)
    assert_conformant(name, lightning, ours)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["template", "manual_two_optimizers"])
def test_harness_is_deterministic(name: str, tmp_path: Path) -> None:
    """Lightning against itself: no difference, or the recorder (not our Trainer) is at fault."""
    first, second = run_case(CASES[name], tmp_path, processes=1, against="lightning")
    assert first.error is None, first.error
    assert compare(first, second) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["template", "logging"])
def test_recording_does_not_change_what_lightning_computes(name: str, tmp_path: Path) -> None:
    """The recording callback reads trainer state at every hook: Lightning's results (weights,
    metrics, return values, checkpoints) must be the same with and without it."""
    observed = run_one(CASES[name], "lightning", tmp_path / "observed", processes=1)
    plain = run_one(CASES[name], "lightning", tmp_path / "plain", processes=1, observe=False)
    for stage in observed.stages + plain.stages:
        stage["callbacks"] = [c for c in stage["callbacks"] if c != "RecordingCallback"]
    observed.events = plain.events = {}  # the plain run records its logger only
    assert compare(observed, plain) == []
