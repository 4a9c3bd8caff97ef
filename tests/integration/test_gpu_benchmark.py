"""`python -m benchmarks.gpu`: its CPU smoke mode end to end (so the GPU command cannot rot between
GPU sessions), the budget, a failing contender, and the arithmetic its verdicts rest on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.gpu import session, summary

REPO = Path(__file__).parents[2]


@pytest.mark.timeout(180)
@pytest.mark.conformance
def test_smoke_run_measures_every_contender_on_the_same_arithmetic(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.gpu", "--smoke", "--workloads", "gpt", "--modes", "eager",
               "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    (phase,) = results["phases"]
    assert (phase["workload"], phase["mode"], phase["errors"]) == ("gpt", "eager", {})
    figures = phase["summary"]["figures"]
    assert list(figures) == ["plain", "torch_ddp", "lightning", "ours", "ours_again"]
    for value in figures.values():
        assert value["step_ms"] > 0 and value["measured_steps"] >= 6 and value["host_ms"] > 0
        assert value["spread"][0] <= value["step_ms"] <= value["spread"][1]
    losses = [value["loss_at_step_3"] for value in figures.values()]
    assert losses == pytest.approx([losses[0]] * 5, abs=1e-5)  # three identical steps in every loop
    assert set(phase["summary"]["ratios"]) == {"ours/plain", "ours/torch_ddp", "ours/lightning", "ours_again/ours"}
    targets = {row["target"] for row in results["targets"]}
    assert targets == {"ours / Lightning, gpt eager", "protocol: ours run twice agree, gpt eager"}
    markdown = (tmp_path / "results.md").read_text()
    assert "## gpt, eager" in markdown and "| ours (DDPStrategy) (again) |" in markdown


@pytest.mark.timeout(60)
def test_a_spent_budget_skips_phases_and_still_writes_results(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--smoke", "--budget-s", "1", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    phases = json.loads((tmp_path / "results.json").read_text())["phases"]
    assert [(p["workload"], p["mode"]) for p in phases] == [(w, m) for w in ("gpt", "gpt2", "resnet50")
                                                          for m in ("eager", "compiled")]
    assert all(p["skipped"] == "the time budget was spent" for p in phases)
    assert "Skipped: the time budget was spent." in (tmp_path / "results.md").read_text()


@pytest.mark.timeout(60)
def test_a_contender_that_fails_answers_with_its_error_and_stays_ready(tmp_path: Path) -> None:
    worker = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu.worker", "--loop", "plain", "--accelerator", "cpu",
                               "--precision", "32-true", "--smoke"], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert worker.stdin is not None and worker.stdout is not None
    assert json.loads(worker.stdout.readline())["alive"]
    worker.stdin.write(json.dumps({"cmd": "start", "workload": "no_such_workload", "mode": "eager"}) + "\n")
    worker.stdin.flush()
    assert "no_such_workload" in json.loads(worker.stdout.readline())["error"]
    worker.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
    worker.stdin.flush()
    assert worker.wait(timeout=30) == 0


def test_busy_time_counts_overlapping_kernels_once_and_ignores_annotations() -> None:
    assert session.union_length([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    cuda = torch.autograd.DeviceType.CUDA
    kernel = SimpleNamespace(device_type=cuda, is_user_annotation=False)
    annotation = SimpleNamespace(device_type=cuda, is_user_annotation=True)
    host = SimpleNamespace(device_type=torch.autograd.DeviceType.CPU, is_user_annotation=False)
    assert [session._device_work(e) for e in (kernel, annotation, host)] == [True, False, False]


def test_steady_needs_three_windows_within_three_percent() -> None:
    assert not session._steady([10.0, 10.0])
    assert session._steady([10.0, 10.2, 9.8])
    assert not session._steady([10.0, 10.5, 9.8])


def test_ratios_are_paired_by_round_and_targets_follow_the_issue() -> None:
    ours = {"step_ms_rounds": [10.0, 20.0, 10.0]}
    plain = {"step_ms_rounds": [9.9, 19.0, 10.1]}
    ratio = summary.paired_ratio(ours, plain)
    assert ratio == pytest.approx({"median": 0.99, "low": 0.95, "high": 1.01})
    phases = [{"workload": "gpt2", "mode": "compiled", "summary": {"ratios": {
        "ours/plain": ratio, "ours/torch_ddp": {"median": 1.01}, "ours/lightning": {"median": 0.97},
        "ours_again/ours": {"median": 1.02}}}}]
    rows = {row["target"]: row["met"] for row in summary.targets(phases, {"gpt2": "GPU-bound"})}
    assert rows == {"ours / plain loop, gpt2 compiled": True, "ours / torch DDP, gpt2 compiled": True,
                    "ours / Lightning, gpt2 compiled": False, "protocol: ours run twice agree, gpt2 compiled": True}
