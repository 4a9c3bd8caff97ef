"""Fault injection: kill, crash, stall or desynchronise a random rank at a random step, many
times, and report.

    python -m benchmarks.faults --trials 8 [--seed 0] [--out benchmarks/results/faults.json]

Each trial trains the same 2-process job with our Trainer and DDPStrategy. One rank, chosen at
random, fails at a random step in one of four ways: SIGKILL (`kill`), an exception (`raise`),
stuck in its own code for 10 minutes (`stall`: only the hang guard can end that early), or
skipping the step (`skip`: `training_step` returns None on that rank alone, so it issues one
gradient all-reduce fewer than its peer). Two scenarios run:

* no restarts: the launch must fail. We record how long after the failure the job had
  ended, whether it hung (no end within 60 s), and whether any worker process was left.
* `DDPStrategy(max_restarts=1)` with a checkpoint every 2 steps: the group restarts,
  resumes from the newest checkpoint by itself, and must end with the same weights as an
  uninterrupted run, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy
from trainer import LightningModule, Trainer, seed_everything
from trainer.callbacks import ModelCheckpoint

HANG_AFTER_S = 60.0  # the hang guard's stall_timeout is 25 s; the process-group timeout 10 min
MODES = ("kill", "raise", "stall", "skip")
EPOCHS, SAMPLES, BATCH = 3, 128, 8  # 2 ranks x 8 per batch: 8 steps per epoch, 24 in all


class FaultyMLP(LightningModule):
    """A small MLP whose rank `fail_rank` dies at `fail_step` in the first attempt only."""

    def __init__(self, fail_rank: int = -1, fail_step: int = -1, mode: str = "raise", stamp: str = "") -> None:
        super().__init__()
        self.fail_rank, self.fail_step, self.mode, self.stamp = fail_rank, fail_step, mode, stamp
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and self.global_rank == self.fail_rank and self.global_step == self.fail_step:
            Path(self.stamp).write_text(str(time.time()))
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "stall":
                time.sleep(600)
            if self.mode == "skip":
                return None
            raise RuntimeError(f"injected failure at step {self.fail_step}")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(SAMPLES, 16, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH, shuffle=True)


@dataclass
class Trial:
    scenario: str
    rank: int
    step: int
    mode: str
    ended_after_s: float | None = None
    hung: bool = False
    leftover_processes: int = 0
    resumed_exactly: bool | None = None
    error: str = ""


def _fit(model: FaultyMLP, workdir: Path, max_restarts: int) -> Trainer:
    checkpoint = ModelCheckpoint(dirpath=workdir / "ckpts", every_n_train_steps=2, save_last=True)
    trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(max_restarts=max_restarts),
                      max_epochs=EPOCHS, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=workdir, callbacks=[checkpoint])
    trainer.fit(model)
    return trainer


def _children() -> int:
    """Worker processes still alive under this process (there should be none; multiprocessing's
    resource tracker, started once per Python process, is not a worker)."""
    me = str(os.getpid())
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            helper = b"resource_tracker" in command or b"forkserver" in command  # multiprocessing's own
            count += fields[1] == me and fields[0] != "Z" and not helper
    return count


def run_trial(scenario: str, rank: int, step: int, mode: str, reference: dict[str, torch.Tensor] | None) -> Trial:
    trial = Trial(scenario, rank, step, mode)
    with TemporaryDirectory() as tmp:
        workdir, stamp = Path(tmp), Path(tmp) / "failed_at"
        seed_everything(0)
        model = FaultyMLP(rank, step, mode, str(stamp))
        try:
            _fit(model, workdir, max_restarts=1 if scenario == "restart" else 0)
        except Exception as error:  # noqa: BLE001 - the failure is what we measure
            trial.error = str(error).splitlines()[0][:160]
        ended = time.time()
        if stamp.exists():
            trial.ended_after_s = round(ended - float(stamp.read_text()), 2) if scenario == "no_restart" else None
            trial.hung = scenario == "no_restart" and ended - float(stamp.read_text()) > HANG_AFTER_S
        time.sleep(0.5)
        trial.leftover_processes = _children()
        if scenario == "restart" and reference is not None:
            trial.resumed_exactly = not trial.error and all(
                torch.equal(value, model.state_dict()[key]) for key, value in reference.items())
    return trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/faults.json")
    args = parser.parse_args()
    chooser = random.Random(args.seed)
    with TemporaryDirectory() as tmp:
        seed_everything(0)
        uninterrupted = FaultyMLP()
        _fit(uninterrupted, Path(tmp), max_restarts=0)
        reference = {k: v.clone() for k, v in uninterrupted.state_dict().items()}
    trials = []
    for trial in range(args.trials):
        rank, step = chooser.randrange(2), chooser.randrange(1, EPOCHS * SAMPLES // (2 * BATCH))
        mode = MODES[trial % len(MODES)]  # every mode alike often
        for scenario in ("no_restart", "restart"):
            trials.append(run_trial(scenario, rank, step, mode, reference))
            print(json.dumps(asdict(trials[-1])), flush=True)
    report = summarize(trials)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": report, "trials": [asdict(t) for t in trials]}, indent=2))
    print(json.dumps(report, indent=2))


def summarize(trials: list[Trial]) -> dict[str, Any]:
    failing = [t for t in trials if t.scenario == "no_restart"]
    restarted = [t for t in trials if t.scenario == "restart"]
    seconds = [t.ended_after_s for t in failing if t.ended_after_s is not None]
    return {
        "trials": len(failing),
        "hangs": sum(t.hung for t in trials),
        "failed_runs_reported": sum(bool(t.error) for t in failing),
        "seconds_to_exit_median": round(statistics.median(seconds), 2) if seconds else None,
        "seconds_to_exit_max": max(seconds) if seconds else None,
        "seconds_to_exit_by_mode": {mode: max((t.ended_after_s for t in failing if t.mode == mode
                                               and t.ended_after_s is not None), default=None) for mode in MODES},
        "restarts_resumed_exactly": f"{sum(bool(t.resumed_exactly) for t in restarted)}/{len(restarted)}",
        "leftover_processes": sum(t.leftover_processes for t in trials),
    }


if __name__ == "__main__":
    main()
