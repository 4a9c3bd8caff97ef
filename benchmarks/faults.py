"""Fault injection: kill, crash, stall or desynchronise a random rank at a random step, many
times, and report.

    python -m benchmarks.faults --trials 8 [--seed 0] [--out benchmarks/results/faults.json]
    python -m benchmarks.faults --scenario preempt --trials 20 [--seed 0]
    python -m benchmarks.faults --scenario savekill --trials 20 [--seed 0]

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

`--scenario preempt`: a preemption notice (SIGTERM or SIGUSR1) goes at a random step to rank 0,
rank 1, every rank, or the launching process. The launch must end with code 75 (`Preempted`) and one
loadable preemption checkpoint; a second fit in the same directory resumes from it and must end
bit-identical to the uninterrupted run. Work lost = steps begun on any rank that the checkpoint does
not hold (at most the step in flight); the notice-to-stop delay is reported in steps.

`--scenario savekill`: rank 0 is SIGKILLed while it writes a checkpoint (a random save, after a random
number of bytes). Every checkpoint file left must load, and with `max_restarts=1` the restarted group
resumes from the newest one and must end bit-identical to the uninterrupted run.
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
from strategies.checkpoint_io import CheckpointError, TorchCheckpointIO
from strategies.preemption import PREEMPTED_EXIT_CODE, Preempted
from trainer import LightningModule, Trainer, seed_everything
from trainer.callbacks import ModelCheckpoint

HANG_AFTER_S = 60.0  # the hang guard's stall_timeout is 25 s; the process-group timeout 10 min
MODES = ("kill", "raise", "stall", "skip")
NOTICE_TARGETS = ("rank0", "rank1", "all", "launcher")
EPOCHS, SAMPLES, BATCH = 3, 128, 8  # 2 ranks x 8 per batch: 8 steps per epoch, 24 in all
STEPS = EPOCHS * SAMPLES // (2 * BATCH)


class FaultyMLP(LightningModule):
    """A small MLP whose rank `fail_rank` dies at `fail_step` in the first attempt only."""

    def __init__(self, fail_rank: int = -1, fail_step: int = -1, mode: str = "raise", stamp: str = "") -> None:
        super().__init__()
        self.fail_rank, self.fail_step, self.mode, self.stamp = fail_rank, fail_step, mode, stamp
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if self.mode == "preempt":
            return self._preempt_step(batch)
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

    def _preempt_step(self, batch: Any) -> torch.Tensor:
        """`fail_rank` encodes the notice's target and signal: NOTICE_TARGETS index * 2 + (SIGUSR1?)."""
        Path(f"{self.stamp}.rank{self.global_rank}").write_text(str(self.global_step))  # the step begun last
        target, number = NOTICE_TARGETS[self.fail_rank // 2], (signal.SIGTERM, signal.SIGUSR1)[self.fail_rank % 2]
        if self.global_step == self.fail_step:
            if target == "launcher" and self.global_rank == 0:
                os.kill(int(Path(f"{self.stamp}.launcher").read_text()), number)
            elif target in ("all", f"rank{self.global_rank}"):
                os.kill(os.getpid(), number)
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


class KilledDuringSave(TorchCheckpointIO):
    """Rank 0 SIGKILLs itself during its `save_index`-th save of the first attempt, once
    `after_bytes` bytes of the file are written: a real death in the middle of a write."""

    def __init__(self, save_index: int = -1, after_bytes: int = 0, marker: str = "") -> None:
        super().__init__()
        self.save_index, self.after_bytes, self.marker, self.saves = save_index, after_bytes, marker, 0

    def save(self, checkpoint: dict[str, Any], path: Any) -> None:
        self.saves += 1
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if not (first_attempt and self.saves == self.save_index):
            super().save(checkpoint, path)
            return
        real_save = torch.save

        def dying_save(obj: Any, handle: Any, *args: Any, **kwargs: Any) -> None:
            real_save(obj, _DieAfter(handle, self.after_bytes, self.marker), *args, **kwargs)

        torch.save = dying_save  # type: ignore[assignment]
        try:
            super().save(checkpoint, path)
        finally:
            torch.save = real_save


class _DieAfter:
    """A file that kills its process once `limit` bytes have gone to the real file."""

    def __init__(self, handle: Any, limit: int, marker: str) -> None:
        self.handle, self.left, self.marker = handle, limit, marker

    def write(self, data: Any) -> int:
        if len(data) >= self.left:
            self.handle.write(bytes(data)[:self.left])
            self.handle.flush()
            Path(self.marker).write_text(str(self.left))  # the trial checks that the kill happened
            os.kill(os.getpid(), signal.SIGKILL)
        self.left -= len(data)
        return int(self.handle.write(data))

    def flush(self) -> None:
        self.handle.flush()


def _fit(model: FaultyMLP, workdir: Path, max_restarts: int, checkpoint_io: Any = None) -> Trainer:
    checkpoint = ModelCheckpoint(dirpath=workdir / "ckpts", every_n_train_steps=2, save_last=True)
    strategy = DDPStrategy(max_restarts=max_restarts, checkpoint_io=checkpoint_io)
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy,
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


@dataclass
class NoticeTrial:
    target: str
    signal: str
    notice_step: int
    exit_code: int | None = None
    stopped_after: int | None = None  # steps the preemption checkpoint holds
    lost_steps: int | None = None  # steps begun on some rank that the checkpoint does not hold
    seconds_to_exit: float | None = None
    checkpoint_loads: bool = False
    resumed_exactly: bool = False
    hung: bool = False
    leftover_processes: int = 0
    error: str = ""


def run_notice_trial(target_code: int, step: int, reference: dict[str, torch.Tensor]) -> NoticeTrial:
    trial = NoticeTrial(NOTICE_TARGETS[target_code // 2], ("SIGTERM", "SIGUSR1")[target_code % 2], step)
    with TemporaryDirectory() as tmp:
        workdir, stamp = Path(tmp), str(Path(tmp) / "step")
        Path(f"{stamp}.launcher").write_text(str(os.getpid()))
        seed_everything(0)
        started = time.monotonic()
        try:
            _fit(FaultyMLP(target_code, step, "preempt", stamp), workdir, max_restarts=0)
            trial.error = "the fit ended without being preempted"
        except Preempted as notice:
            trial.exit_code = int(notice.code)  # type: ignore[arg-type]
        except Exception as error:  # noqa: BLE001 - what we measure
            trial.error = str(error).splitlines()[0][:160]
        trial.seconds_to_exit = round(time.monotonic() - started, 2)
        trial.hung = trial.seconds_to_exit > HANG_AFTER_S
        path = workdir / "preempted.ckpt"
        try:
            trial.stopped_after = int(TorchCheckpointIO().load(path)["global_step"])
            trial.checkpoint_loads = True
        except CheckpointError as error:
            trial.error = trial.error or str(error)[:160]
        begun = [int(Path(f"{stamp}.rank{rank}").read_text()) + 1 for rank in range(2)]
        trial.lost_steps = max(begun) - trial.stopped_after if trial.stopped_after is not None else None
        seed_everything(0)
        resumed = FaultyMLP(target_code, step, "preempt", stamp)
        try:
            _fit(resumed, workdir, max_restarts=0)
            trial.resumed_exactly = all(torch.equal(v, resumed.state_dict()[k]) for k, v in reference.items())
        except BaseException as error:  # noqa: BLE001
            trial.error = trial.error or f"resume: {str(error).splitlines()[0][:150]}"
        time.sleep(0.5)
        trial.leftover_processes = _children()
    return trial


@dataclass
class SaveKillTrial:
    save_index: int
    after_bytes: int
    killed: bool = False
    files_left: int = 0
    corrupt_files: int = 0
    resumed_exactly: bool = False
    hung: bool = False
    leftover_processes: int = 0
    error: str = ""


def run_savekill_trial(save_index: int, after_bytes: int, reference: dict[str, torch.Tensor]) -> SaveKillTrial:
    trial = SaveKillTrial(save_index, after_bytes)
    with TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        seed_everything(0)
        model = FaultyMLP()
        started = time.monotonic()
        try:
            killing = KilledDuringSave(save_index, after_bytes, str(workdir / "killed"))
            _fit(model, workdir, max_restarts=1, checkpoint_io=killing)
            trial.resumed_exactly = all(torch.equal(v, model.state_dict()[k]) for k, v in reference.items())
        except Exception as error:  # noqa: BLE001
            trial.error = str(error).splitlines()[0][:160]
        trial.hung = time.monotonic() - started > HANG_AFTER_S
        trial.killed = (workdir / "killed").exists()
        files = sorted((workdir / "ckpts").glob("*.ckpt"))
        trial.files_left = len(files)
        for file in files:
            try:
                TorchCheckpointIO().load(file)
            except CheckpointError:
                trial.corrupt_files += 1
        time.sleep(0.5)
        trial.leftover_processes = _children()
    return trial


def _reference() -> dict[str, torch.Tensor]:
    with TemporaryDirectory() as tmp:
        seed_everything(0)
        uninterrupted = FaultyMLP()
        _fit(uninterrupted, Path(tmp), max_restarts=0)
        return {k: v.clone() for k, v in uninterrupted.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("crash", "preempt", "savekill"), default="crash")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="default: benchmarks/results/faults[_SCENARIO].json")
    args = parser.parse_args()
    out = args.out or f"benchmarks/results/faults{'' if args.scenario == 'crash' else '_' + args.scenario}.json"
    chooser = random.Random(args.seed)
    reference = _reference()
    if args.scenario != "crash":
        _run_other_scenario(args.scenario, args.trials, chooser, reference, Path(out))
        return
    trials = []
    for trial in range(args.trials):
        rank, step = chooser.randrange(2), chooser.randrange(1, STEPS)
        mode = MODES[trial % len(MODES)]  # every mode alike often
        for scenario in ("no_restart", "restart"):
            trials.append(run_trial(scenario, rank, step, mode, reference))
            print(json.dumps(asdict(trials[-1])), flush=True)
    report = summarize(trials)
    _write(Path(out), report, trials)


def _run_other_scenario(scenario: str, count: int, chooser: random.Random, reference: dict[str, torch.Tensor],
                        out: Path) -> None:
    trials: list[Any] = []
    for trial in range(count):
        if scenario == "preempt":  # every target and signal alike often; a step with at least one after it
            trials.append(run_notice_trial(trial % (2 * len(NOTICE_TARGETS)), chooser.randrange(0, STEPS - 2),
                                           reference))
        else:  # saves come every 2 steps, each writes 2 files (top-k, last) of ~114 KiB: 24 saves in a fit
            trials.append(run_savekill_trial(chooser.randrange(1, STEPS), chooser.randrange(1, 110_000), reference))
        print(json.dumps(asdict(trials[-1])), flush=True)
    report = summarize_notices(trials) if scenario == "preempt" else summarize_savekills(trials)
    _write(out, report, trials)


def summarize_notices(trials: list[NoticeTrial]) -> dict[str, Any]:
    delays = [t.stopped_after - t.notice_step for t in trials if t.stopped_after is not None]
    return {
        "trials": len(trials), "hangs": sum(t.hung for t in trials),
        "exit_code_75": f"{sum(t.exit_code == PREEMPTED_EXIT_CODE for t in trials)}/{len(trials)}",
        "checkpoints_missing_or_corrupt": sum(not t.checkpoint_loads for t in trials),
        "resumed_exactly": f"{sum(t.resumed_exactly for t in trials)}/{len(trials)}",
        "lost_steps_max": max((t.lost_steps for t in trials if t.lost_steps is not None), default=None),
        "notice_to_stop_steps_max": max(delays, default=None),
        "seconds_to_exit_max": max((t.seconds_to_exit or 0.0) for t in trials),
        "leftover_processes": sum(t.leftover_processes for t in trials),
        "errors": [t.error for t in trials if t.error],
    }


def summarize_savekills(trials: list[SaveKillTrial]) -> dict[str, Any]:
    return {
        "trials": len(trials), "hangs": sum(t.hung for t in trials),
        "killed_during_a_save": f"{sum(t.killed for t in trials)}/{len(trials)}",
        "corrupt_checkpoint_files": sum(t.corrupt_files for t in trials),
        "trials_left_without_a_checkpoint": sum(t.files_left == 0 for t in trials),
        "resumed_exactly": f"{sum(t.resumed_exactly for t in trials)}/{len(trials)}",
        "leftover_processes": sum(t.leftover_processes for t in trials),
        "errors": [t.error for t in trials if t.error],
    }


def _write(out: Path, report: dict[str, Any], trials: list[Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": report, "trials": [asdict(t) for t in trials]}, indent=2))
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
