"""`python -m benchmarks.stages --quick` (fit then test) end to end for our Trainer on digits, and
the same-round ratios on synthetic runs. Nothing here judges a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import stages

REPO = Path(__file__).parents[2]


@pytest.mark.timeout(120)
@pytest.mark.conformance
def test_quick_stages_run_times_fit_then_test(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.stages", "--quick", "--workloads", "digits", "--contenders", "ours",
               "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert "error" not in run, run.get("error")
    assert run["fit_s"] > 0 and run["test_s"] > 0 and run["wall_s"] > run["fit_s"] + run["test_s"]
    assert run["test_metrics"]["threads"] == 1.0 and run["test_metrics"]["test_acc"] > 0.5
    assert [note["strategies"] for note in run["code"]] == [str(REPO / "strategies" / "__init__.py")] * 2
    assert run["leftover"]["after_grace_killed"] == []
    assert "| digits | ours now (workers live across stages) |" in (tmp_path / "results.md").read_text()


def _run(contender: str, repeat: int, test_s: float, failed: bool = False) -> dict:
    run = {"workload": "digits", "contender": contender, "repeat": repeat, "fit_s": 5.0, "test_s": test_s,
           "wall_s": 10.0, "startup_s": 2.0, "exit_s": 1.0, "leftover": {"after_grace_killed": []}}
    return {**run, "error": "boom"} if failed else run


def test_ratios_pair_the_rounds_and_skip_failures() -> None:
    runs = [_run("ours", 0, 1.0), _run("pl_ddp", 0, 0.5), _run("ours", 1, 3.0), _run("pl_ddp", 1, 1.0),
            _run("ours", 2, 9.0, failed=True), _run("pl_ddp", 2, 1.0)]
    summary = stages.summarize(runs)["digits"]
    assert summary["contenders"]["ours"]["test_s"]["median"] == pytest.approx(2.0)
    assert summary["contenders"]["ours"]["failed"] == 1
    ratio = summary["ratios"]["test() after fit: ours now / Lightning"]
    assert ratio["of_medians"] == pytest.approx(2.0)  # 2.0 / 1.0
    assert (ratio["same_round"]["min"], ratio["same_round"]["max"]) == pytest.approx((2.0, 3.0))
    assert "**2.00×** (2.00–3.00)" in stages.render_tables({"summary": stages.summarize(runs)})
