"""`ddp-train` end to end, as a user runs it: a subprocess, then the TensorBoard event files.

Asserts on logged values (accuracy reached, loss went down, one validation per epoch, the
expected number of optimizer steps), not just on exit codes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]


def ddp_train(args: list[str], cwd: Path, timeout: float = 280) -> str:
    environment = {name: value for name, value in os.environ.items() if name != "HYDRA_FULL_ERROR"}
    environment["OMP_NUM_THREADS"] = "1"
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "trainer", *args, *QUIET], cwd=cwd, env=environment,
                          text=True, capture_output=True, timeout=timeout)
    assert proc.returncode == 0, f"ddp-train {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def run_dirs(root: Path) -> list[Path]:
    """Directories holding a `.hydra/` folder: one per run (per job in a multirun)."""
    return sorted(path.parent for path in root.rglob(".hydra"))


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = list(run_dir.rglob("events.out.tfevents.*"))
    assert len(events) == 1, f"expected one TensorBoard event file under {run_dir}, found {events}"
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def first_and_last(values: list[tuple[int, float]], n: int = 2) -> tuple[float, float]:
    head, tail = [v for _, v in values[:n]], [v for _, v in values[-n:]]
    return sum(head) / len(head), sum(tail) / len(tail)


@pytest.mark.timeout(300)
def test_ddp_two_processes_learns_digits(tmp_path: Path) -> None:
    """The default job (MLP, our DDP on 2 processes), shortened to 4 epochs."""
    stdout = ddp_train(["trainer.max_epochs=4"], tmp_path)
    (run_dir,) = run_dirs(tmp_path)
    assert run_dir.parent.parent == tmp_path / "outputs"  # outputs/<date>/<time>
    metrics = scalars(run_dir)
    val_acc, train_loss = metrics["val_acc"], metrics["train_loss"]
    assert len(val_acc) == 4  # one validation per epoch
    assert val_acc[-1][1] >= 0.93, val_acc
    start, end = first_and_last(train_loss)
    assert end < 0.5 * start, train_loss
    # The CLI config gives TelemetryMonitor(print_summary=True): phase times and overlap per logging window,
    # one line at the end.
    overlap, step_ms = metrics["telemetry/overlap_pct"], metrics["telemetry/step_ms"]
    assert all(0.0 <= value <= 100.0 for _, value in overlap) and all(value > 0 for _, value in step_ms)
    assert [step for step, _ in overlap] == [step for step, _ in metrics["telemetry/exposed_comm_ms"]]
    assert metrics["telemetry/buckets"][-1][1] >= 1
    (summary,) = [line for line in stdout.splitlines() if line.startswith("telemetry: ")]
    assert "ms/step = forward" in summary and "overlap" in summary and "bucket_cap_mb=25.0" in summary
    # 1,438 training images / (2 ranks x 64) = 12 steps per epoch; logged every 5 steps.
    steps = [step for step, _ in train_loss]
    assert steps == sorted(steps) and 40 <= steps[-1] <= 48 and len(steps) == 48 // 5
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert list((run_dir / "checkpoints").glob("*.ckpt"))
    assert "ddp-train: finished" in stdout and f"tensorboard --logdir {run_dir}" in stdout


@pytest.mark.timeout(300)
@pytest.mark.conformance
def test_single_process_and_multirun_over_the_other_demos(tmp_path: Path) -> None:
    """One process (`strategy=single`), and a multirun over the GPT and regression experiments."""
    ddp_train(["strategy=single", "trainer.devices=1", "trainer=fast"], tmp_path / "single")
    (single,) = run_dirs(tmp_path / "single")
    metrics = scalars(single)
    assert len(metrics["val_acc"]) == 2 and metrics["val_acc"][-1][1] > 0.5
    steps = [step for step, _ in metrics["train_loss"]]
    assert steps[0] in (0, 1) and steps == list(range(steps[0], steps[0] + 8))  # 2 epochs x 4 batches

    ddp_train(["-m", "experiment=char_gpt,synthetic_regression", "strategy=single", "trainer.devices=1",
               "trainer=fast", "trainer.max_epochs=2", "trainer.limit_train_batches=20", "data.batch_size=16"],
              tmp_path / "multi")
    gpt, regression = run_dirs(tmp_path / "multi")  # multirun/<date>/<time>/{0,1}
    assert (gpt.name, regression.name) == ("0", "1")
    for run_dir in (gpt, regression):
        val_loss = scalars(run_dir)["val_loss"]
        assert len(val_loss) == 2 and val_loss[1][1] < val_loss[0][1], (run_dir, val_loss)
        assert list((run_dir / "checkpoints").glob("*.ckpt")), run_dir
    start, end = first_and_last(scalars(gpt)["train_loss"])
    assert end < start < 3.2  # from ln(vocab) ~ 3.9 nats per character at step 0
    assert "vocab_size" in (gpt / ".hydra" / "config.yaml").read_text()


@pytest.mark.timeout(300)
def test_torchrun_ranks_share_one_run_directory(tmp_path: Path) -> None:
    """Under torchrun every rank runs ddp-train; they must agree on one directory, and only
    rank 0 writes Hydra's files there."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    environment = {name: value for name, value in os.environ.items() if name != "HYDRA_FULL_ERROR"}
    environment["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=2", "-m", "trainer", "trainer=fast",
                           *QUIET], cwd=tmp_path, env=environment, text=True, capture_output=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-5000:]
    (run_dir,) = run_dirs(tmp_path)
    assert run_dir.name.startswith("torchrun-") and [p.name for p in (tmp_path / "outputs").iterdir()] == [run_dir.name]
    assert len(list(run_dir.glob("*.log"))) == 1  # rank 1 logs to stdout only
    assert len(scalars(run_dir)["val_acc"]) == 2
    assert proc.stdout.count("ddp-train: finished") == 1  # the summary comes from rank 0 only
