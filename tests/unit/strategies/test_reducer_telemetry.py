"""ReducerTelemetry: backward, exposed and total communication per step, overlap; pure timing
logic with a fake clock and fake futures (no process group)."""

from __future__ import annotations

import pytest

from strategies import telemetry as telemetry_module
from strategies.telemetry import ReducerTelemetry, StepTimes, union_length as _union_length


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Future:
    def __init__(self) -> None:
        self.finished = False

    def done(self) -> bool:
        return self.finished


def test_union_counts_overlapping_buckets_once_and_open_ones_until_now() -> None:
    assert _union_length([[0.0, 2.0], [1.0, 3.0], [5.0, 6.0]], now=10.0) == pytest.approx(4.0)
    assert _union_length([[1.0, 0.0]], now=4.0) == pytest.approx(3.0)  # not seen done: counts until now
    assert _union_length([], now=1.0) == 0.0


def test_overlap_is_the_hidden_share_of_communication() -> None:
    assert StepTimes(backward_s=1.0, exposed_comm_s=0.25, comm_s=1.0).overlap == pytest.approx(0.75)
    assert StepTimes(exposed_comm_s=0.5, comm_s=0.0).overlap == 1.0  # no communication: nothing exposed
    assert StepTimes(exposed_comm_s=2.0, comm_s=1.0).overlap == 0.0  # clamped


def test_a_step_split_into_backward_exposed_and_total_comm(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(telemetry_module.time, "perf_counter", clock)
    telemetry, early, late = ReducerTelemetry(), _Future(), _Future()
    telemetry.begin_backward()                      # t=0
    clock.now = 0.010
    telemetry.bucket_launched(early)                # first bucket sent at 10 ms
    clock.now = 0.030
    early.finished = True
    telemetry.poll()                                # seen done at 30 ms (a later gradient hook)
    clock.now = 0.040
    telemetry.end_backward()                        # autograd done at 40 ms
    telemetry.bucket_launched(late)                 # the rest sent at 40 ms
    clock.now = 0.055
    late.finished = True
    step = telemetry.end_step()                     # averaged at 55 ms
    assert step.backward_s == pytest.approx(0.040)
    assert step.exposed_comm_s == pytest.approx(0.015)
    assert step.comm_s == pytest.approx(0.035)      # [10, 30] + [40, 55]
    assert step.overlap == pytest.approx(1 - 15 / 35)
    summary = telemetry.summary()
    assert summary["synced_steps"] == 1 and summary["comm_s_total"] == pytest.approx(0.035)
    assert summary["overlap_mean"] == pytest.approx(step.overlap)
