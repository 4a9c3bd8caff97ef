"""`make bench-check`'s verdicts, on runs written by hand (it never times anything here)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.check import FLOORS, Floor, judge, paired_ratios


def _runs(speeds: dict[str, list[float]], workload: str = "mlp") -> list[dict[str, Any]]:
    return [{"workload": workload, "contender": name, "repeat": index, "samples_per_s": speed}
            for name, per_round in speeds.items() for index, speed in enumerate(per_round)]


def test_ratios_are_paired_by_round_and_skip_failed_runs() -> None:
    runs = _runs({"ours": [150.0, 140.0, 160.0], "torch_ddp": [100.0, 70.0, 100.0]})
    runs[1]["error"] = "killed"  # ours failed in round 1
    assert paired_ratios(runs, "mlp", "ours", "torch_ddp") == [1.5, 1.6]


def test_the_regression_of_issue_37_fails() -> None:
    """643244e on the mlp: ours 754 samples/s, torch DDP 777, ours inside Lightning 992 (quiet rounds)."""
    runs = _runs({"ours": [754.0, 760.0, 748.0], "torch_ddp": [777.0, 780.0, 770.0], "pl_ours": [992.0, 990.0, 1000.0]})
    verdicts = judge(runs, tuple(floor for floor in FLOORS if floor.workload == "mlp"))
    assert [verdict.passed for verdict in verdicts] == [False, False]


def test_a_lead_inside_the_noise_passes_and_a_loss_beyond_it_fails() -> None:
    floor = (Floor("gpt", "torch_ddp", 1.0),)
    noisy = _runs({"ours": [90.0, 110.0, 97.0], "torch_ddp": [100.0, 100.0, 100.0]}, "gpt")  # 0.97, noise ±10 %
    assert judge(noisy, floor)[0].passed
    quiet = _runs({"ours": [95.0, 96.0, 95.5], "torch_ddp": [100.0, 100.0, 100.0]}, "gpt")  # 0.955, noise ±2 %
    assert not judge(quiet, floor)[0].passed


def test_no_paired_round_is_an_error_not_a_pass() -> None:
    with pytest.raises(SystemExit, match="no round where both ours and torch_ddp finished on gpt"):
        judge(_runs({"ours": [1.0]}, "gpt"), (Floor("gpt", "torch_ddp", 1.0),))
