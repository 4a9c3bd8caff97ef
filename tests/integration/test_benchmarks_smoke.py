"""`python -m benchmarks.run --quick` end to end on the smallest workload, and the report
rendering on synthetic results (every table, target and plot path, without running anything)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import report

REPO = Path(__file__).parents[2]


@pytest.mark.timeout(120)
@pytest.mark.conformance
def test_quick_run_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.run", "--quick", "--workloads", "cnn", "--contenders",
               "torch_ddp,ours", "--steps", "2", "--warmup", "1", "--launch-repeats", "1", "--out", str(tmp_path),
               "--docs", str(tmp_path / "readme.md")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    runs = results["runs"]
    assert [run["contender"] for run in runs] == ["torch_ddp", "ours"]
    assert all("error" not in run for run in runs), [run.get("error") for run in runs]
    for run in runs:
        assert run["samples_per_s"] > 0 and run["launch_to_first_step_s"] > 0 and run["peak_rss_mib"] > 100
        assert [rank["steps_done"] for rank in run["ranks"]] == [3, 3]
    assert runs[0]["final_loss"] == pytest.approx(runs[1]["final_loss"], abs=1e-5)  # same work, same result
    assert runs[1]["reducer"]["synced_steps"] == 3
    assert "| cnn (compute-bound) | our Trainer + DDPStrategy |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").stat().st_size > 10_000
    assert (tmp_path / "readme.md").read_text().startswith("## Results")
    launch_runs = results["launch_runs"]  # launch-only: each run stops after its second step
    assert [run["contender"] for run in launch_runs] == ["torch_ddp", "ours"]
    assert all(rank["steps_done"] == 2 for run in launch_runs for rank in run["ranks"])
    launch_target = next(t for t in results["targets"] if t["target"].startswith("launch->first step"))
    expected = launch_runs[1]["launch_to_first_step_s"] / launch_runs[0]["launch_to_first_step_s"]
    assert launch_target["measured"] == pytest.approx(expected) and "(launch-only rounds)" in launch_target["target"]


@pytest.mark.timeout(120)
@pytest.mark.conformance
def test_precision_and_batch_size_reach_every_contender(tmp_path: Path) -> None:
    """bf16-mixed autocast in the hand-written loop and in our Trainer alike: the same loss."""
    command = [sys.executable, "-m", "benchmarks.run", "--quick", "--workloads", "cnn", "--contenders",
               "torch_ddp,ours", "--precision", "bf16-mixed", "--batch-size", "6", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    meta, runs = results["meta"], results["runs"]
    assert (meta["precision"], meta["batch_per_rank"], meta["ranks"]) == ("bf16-mixed", {"cnn": 6}, 2)
    assert all("error" not in run for run in runs), [run.get("error") for run in runs]
    assert [rank["batch_size"] for run in runs for rank in run["ranks"]] == [6] * 4  # as the loops saw them
    assert runs[0]["final_loss"] == pytest.approx(runs[1]["final_loss"], abs=1e-5)
    fp32 = subprocess.run([*command[:-6], "--batch-size", "6", "--contenders", "torch_ddp", "--launch-repeats", "0",
                           "--out", str(tmp_path / "fp32")], cwd=REPO, capture_output=True, text=True, timeout=110)
    assert fp32.returncode == 0, fp32.stderr[-3000:]
    fp32_loss = json.loads((tmp_path / "fp32" / "results.json").read_text())["runs"][0]["final_loss"]
    assert fp32_loss != runs[0]["final_loss"]  # autocast did change the arithmetic
    assert "precision bf16-mixed" in (tmp_path / "results.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_without_a_gpu_is_refused_by_name() -> None:
    from benchmarks.run import parse_args

    with pytest.raises(SystemExit, match="--accelerator cuda: no CUDA device is visible"):
        parse_args(["--accelerator", "cuda"])


def _run(workload: str, contender: str, repeat: int, speed: float) -> dict:
    return {"workload": workload, "contender": contender, "repeat": repeat, "samples_per_s": speed,
            "launch_to_first_step_s": 5.0, "peak_rss_mib": 400.0, "final_loss": 1.0,
            "reducer": {"buckets": 3, "autotune": {"chosen_mb": 25.0}}}


def test_report_ratios_targets_and_rendering(tmp_path: Path) -> None:
    speeds = {"torch_ddp": 100.0, "ours": 120.0, "pl_ddp": 95.0, "pl_ours": 97.0, "ours_bf16": 150.0}
    runs = [_run(workload, name, repeat, speed * (1 + repeat / 100))
            for repeat in range(3) for workload in ("mlp", "cnn") for name, speed in speeds.items()]
    runs.append({**_run("cnn", "single", 0, 50.0), "error": "boom"})
    summary = report.summarize(runs)
    assert summary["mlp"]["ours"]["samples_per_s"]["median"] == pytest.approx(121.2)
    assert summary["mlp"]["ours"]["speed_vs_torch_ddp"]["median"] == pytest.approx(1.2)
    assert summary["cnn"]["single"]["failed"] == 1 and summary["cnn"]["single"]["samples_per_s"] is None
    accuracy = {"val_acc": {"fp32": [0.97, 0.96], "bf16": [0.965, 0.96]}, "command": "ddp-train ..."}
    launch = report.summarize([{**_run("mlp", name, repeat, 1.0), "launch_to_first_step_s": seconds + repeat}
                               for repeat in range(3) for name, seconds in (("torch_ddp", 4.0), ("ours", 4.4))])
    found = {item["target"]: item for item in report.targets(summary, accuracy, launch)}
    assert found["launch->first step ours / torch DDP, mlp (launch-only rounds)"]["measured"] == pytest.approx(1.08)
    assert found["launch->first step ours / torch DDP, mlp (launch-only rounds)"]["met"] is False  # > 1.05
    assert found["launch->first step ours / torch DDP, cnn"]["met"] is True  # no launch-only rounds: the main runs
    assert found["ours / torch DDP, mlp (comm-bound)"]["met"] is True  # 1.20 >= 1.15
    assert found["ours bf16 / torch DDP, mlp"]["met"] is True
    assert found["ours / Lightning ddp, cnn"]["met"] is True
    assert found["digits val_acc |bf16 - fp32| comm (points)"]["measured"] == pytest.approx(0.25)
    sweep = {"workload": "mlp", "caps": ["1", "25", "auto"],
             "runs": [{**_run("mlp", "ours", 0, 100.0 + i), "cap": cap} for i, cap in enumerate(["1", "25", "auto",
                                                                                                   "torch_ddp"])]}
    results = {"meta": {"command": "x", "started": "now", "load_before": [0.5], "load_after": [0.6], "cpu": "cpu",
                        "cores": 2, "torch": "2", "pytorch_lightning": "2", "python": "3.11", "cuda": None,
                        "repeats": 3, "launch_repeats": 3, "steps": {"mlp": [1, 2], "cnn": [1, 2]},
                        "batch_per_rank": {"mlp": 32, "cnn": 32}},
               "runs": runs, "summary": summary, "targets": list(found.values()), "accuracy": accuracy, "launch": launch,
               "sweep": report.summarize_sweep(sweep)}
    markdown = report.render_markdown(results)
    assert "| mlp (comm-bound) | our Trainer + DDPStrategy | 121.2 (120.0–122.4) | **1.20×** (1.20–1.20) |" in markdown
    assert "| cnn (compute-bound) | 1 process, no DDP | failed |" in markdown
    assert "auto → 25.0" in markdown and "CUDA device: none" in markdown
    assert "| mlp | our Trainer + DDPStrategy | 5.40 (4.40–6.40) | 1.080 (1.067–1.100) |" in markdown
    (tmp_path / "results.json").write_text(json.dumps(results))
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    report.regenerate(tmp_path / "results.json", tmp_path / "section.md")
    assert (tmp_path / "results.png").exists() and (tmp_path / "sweep.png").exists()
    assert "### Targets" in (tmp_path / "section.md").read_text()


@pytest.mark.timeout(120)
def test_reducer_ab_times_both_data_paths() -> None:
    """benchmarks/reducer_ab.py switches the reducer's private mode flags: it must still run both paths."""
    command = [sys.executable, "-m", "benchmarks.reducer_ab", "--workload", "gpt_host", "--blocks", "2",
               "--block-steps", "1"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gpt_host: rank 0 median step, in place" in done.stdout and "copy / in place = " in done.stdout


@pytest.mark.timeout(240)
def test_loop_ab_fits_every_contender_in_the_same_two_ranks(tmp_path: Path) -> None:
    """benchmarks/loop_ab.py: both Trainers and torch DDP take turns in one pair of ranks, paired by round."""
    contenders = "ours,pl_ours,torch_ddp,ours:telemetry=off"
    command = [sys.executable, "-m", "benchmarks.loop_ab", "--workload", "gpt_host", "--rounds", "2", "--warmup", "1",
               "--steps", "2", "--contenders", contenders, "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    samples = result["samples_per_s"]
    assert list(samples) == contenders.split(",")
    assert all(len(rounds) == 2 and all(value > 0 for value in rounds) for rounds in samples.values())
    ratio = result["ours / pl_ours"]
    assert ratio["rounds"] == pytest.approx([a / b for a, b in zip(samples["ours"], samples["pl_ours"])])
    assert ratio["min"] <= ratio["median"] <= ratio["max"]
    assert "ours / torch_ddp = " in done.stdout and "ours / ours:telemetry=off = " in done.stdout


@pytest.mark.parametrize("contenders, problem", [
    ("ours,plain", "unknown"), ("ours,ours", "distinct"), ("pl_ours:telemetry=off", "only ours takes an option"),
    ("ours:speed=2", "only ours takes an option"), ("ours:telemetry", "only ours takes an option")])
def test_loop_ab_names_a_contender_it_cannot_run(contenders: str, problem: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import loop_ab

    with pytest.raises(SystemExit) as raised:
        loop_ab.parse_options(["--contenders", contenders])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert "--contenders" in error and problem in error


@pytest.mark.timeout(240)
def test_loop_ab_runs_torch_ddp_as_the_first_fit(tmp_path: Path) -> None:
    """torch DDP first in round 0: it must find (not assume) the process group no Trainer has made yet."""
    command = [sys.executable, "-m", "benchmarks.loop_ab", "--workload", "gpt_host", "--rounds", "1", "--warmup", "1",
               "--steps", "1", "--contenders", "torch_ddp,ours", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = json.loads((tmp_path / "results.json").read_text())["samples_per_s"]
    assert list(samples) == ["torch_ddp", "ours"] and all(len(rounds) == 1 for rounds in samples.values())


def test_loop_ab_ranks_keep_one_thread_count_through_lightnings_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fit of a round must run with the same threads. Lightning's launcher sets a rank's share of the cores
    (and OMP_NUM_THREADS) unless OMP_NUM_THREADS is set: on a 16-core host, with the rank at 1 thread and no
    OMP_NUM_THREADS, the fits after the first pl_ours ran at 8 threads and those before it at 1."""
    from lightning_fabric.utilities.distributed import _set_num_threads_if_needed

    from benchmarks import loop_ab

    monkeypatch.setattr(os, "environ", {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    before = torch.get_num_threads()
    try:
        loop_ab.settle_rank(0, 12345)
        settled = torch.get_num_threads()
        _set_num_threads_if_needed(num_processes=loop_ab.RANKS)  # what pl_ours' launcher does under torchrun
        assert torch.get_num_threads() == settled == 8  # each rank's share, as benchmarks.run's contenders take it
        assert os.environ["OMP_NUM_THREADS"] == "8" and os.environ["WORLD_SIZE"] == "2"
    finally:
        torch.set_num_threads(before)
