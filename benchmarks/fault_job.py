"""One job of the fault harness (benchmarks/faults.py), run in a process of its own.

    python -m benchmarks.fault_job '{"workdir": "...", "fail_rank": 0, "fail_step": 5, "mode": "kill", ...}'

This process is global rank 0 of a 2-rank fit with our Trainer and DDPStrategy, as a user's script
is: a fault injected on rank 0 (SIGKILL, a stall, an exception) hits this job and never the harness.
Every fault fires once per trial, whatever the restart count says: the rank that injects it first
writes the stamp `failed_at` in the job's folder, and nothing fires once the stamp exists (a
restarted group, a requeued job). What the job leaves in its folder, for the harness to read:

* `final.pt`: the weights after a fit that ended normally;
* `result.json`: the exception the fit ended with (absent when the process was killed);
* `attempts.rank<R>`: one line per attempt a rank began, `<TORCHELASTIC_RESTART_COUNT>/<strategy.restart_count>`
  (the variable as user code reads it, "0" when unset), so the harness can check that every rank,
  rank 0 included, saw the same restart count;
* `step.rank<R>`: the step a rank began last (the preemption scenario's work lost);
* `failed_at`: when the fault fired (epoch seconds).

The job exits 0 after a normal fit, 75 when preempted (`Preempted` is a SystemExit), 1 on an
exception, and -9 (SIGKILL) when the fault or the save kill ended rank 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy
from strategies.checkpoint_io import TorchCheckpointIO
from trainer import LightningModule, Trainer, seed_everything
from trainer.callbacks import ModelCheckpoint

MODES = ("kill", "raise", "stall", "skip")
NOTICE_TARGETS = ("rank0", "rank1", "all", "outside")  # outside: the harness signals the job's process
EPOCHS, SAMPLES, BATCH = 3, 128, 8  # 2 ranks x 8 per batch: 8 steps per epoch, 24 in all
STEPS = EPOCHS * SAMPLES // (2 * BATCH)


@dataclass
class JobSpec:
    """What one job does. `mode`: one of MODES, "preempt" (fail_rank then encodes the notice's target
    and signal, see `notice_of`), or "none"; `resume` fits with ckpt_path="last" (a requeued job)."""

    workdir: str
    fail_rank: int = -1
    fail_step: int = -1
    mode: str = "none"
    max_restarts: int = 0
    resume: bool = False
    save_index: int = -1  # rank 0 is SIGKILLed during this save (savekill), after `after_bytes` bytes
    after_bytes: int = 0
    zero_stage: int = 0  # DDPStrategy's options under test (the harness's --zero-stage, --async-checkpoint)
    async_checkpoint: bool = False

    def path(self, name: str) -> Path:
        return Path(self.workdir, name)


def notice_of(code: int) -> tuple[str, signal.Signals]:
    """A preemption trial's target and signal: NOTICE_TARGETS index * 2 + (SIGUSR1?)."""
    return NOTICE_TARGETS[code // 2], (signal.SIGTERM, signal.SIGUSR1)[code % 2]


def stamp_fault(spec: JobSpec) -> bool:
    """Write the trial's fault stamp unless a fault already fired in this trial; True if this call wrote it."""
    stamp = spec.path("failed_at")
    if stamp.exists():
        return False
    stamp.write_text(str(time.time()))
    return True


class FaultyMLP(LightningModule):
    """A small MLP whose rank `spec.fail_rank` fails at `spec.fail_step`, once per trial."""

    def __init__(self, spec: JobSpec) -> None:
        super().__init__()
        self.spec = spec
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def on_train_start(self) -> None:
        seen = f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{self.trainer.strategy.restart_count}"
        with self.spec.path(f"attempts.rank{self.global_rank}").open("a") as attempts:
            attempts.write(seen + "\n")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        spec = self.spec
        self.spec.path(f"step.rank{self.global_rank}").write_text(str(self.global_step))  # the step begun last
        if spec.mode == "preempt":
            self._maybe_notice()
        elif self.global_rank == spec.fail_rank and self.global_step == spec.fail_step and stamp_fault(spec):
            if spec.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if spec.mode == "stall":
                time.sleep(600)
            if spec.mode == "skip":
                return None
            raise RuntimeError(f"injected failure at step {spec.fail_step}")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def _maybe_notice(self) -> None:
        target, number = notice_of(self.spec.fail_rank)
        if self.global_step != self.spec.fail_step or target not in ("all", f"rank{self.global_rank}"):
            return
        stamp_fault(self.spec)
        os.kill(os.getpid(), number)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(SAMPLES, 16, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH, shuffle=True)


class KilledDuringSave(TorchCheckpointIO):
    """Rank 0 SIGKILLs itself during its `save_index`-th save, once per trial, once `after_bytes`
    bytes of the file are written: a real death in the middle of a write."""

    def __init__(self, spec: JobSpec) -> None:
        super().__init__()
        self.spec, self.saves = spec, 0

    def save(self, checkpoint: dict[str, Any], path: Any) -> None:
        self.saves += 1
        if self.saves != self.spec.save_index or self.spec.path("killed").exists():
            super().save(checkpoint, path)
            return
        real_save = torch.save

        def dying_save(obj: Any, handle: Any, *args: Any, **kwargs: Any) -> None:
            dying = _DieAfter(handle, self.spec.after_bytes, self.spec.path("killed"))
            real_save(obj, dying, *args, **kwargs)  # type: ignore[arg-type]

        torch.save = dying_save  # type: ignore[assignment]
        try:
            super().save(checkpoint, path)
        finally:
            torch.save = real_save


class _DieAfter:
    """A file that kills its process once `limit` bytes have gone to the real file."""

    def __init__(self, handle: Any, limit: int, marker: Path) -> None:
        self.handle, self.left, self.marker = handle, limit, marker

    def write(self, data: Any) -> int:
        if len(data) >= self.left:
            self.handle.write(bytes(data)[:self.left])
            self.handle.flush()
            self.marker.write_text(str(time.time()))  # the trial checks that the kill happened
            os.kill(os.getpid(), signal.SIGKILL)
        self.left -= len(data)
        return int(self.handle.write(data))

    def flush(self) -> None:
        self.handle.flush()


def fit(spec: JobSpec) -> FaultyMLP:
    """The trial's fit: a checkpoint every 2 steps (top-k and last), seeded as every other job."""
    seed_everything(0)
    model = FaultyMLP(spec)
    checkpoint_io = KilledDuringSave(spec) if spec.save_index > 0 else None
    checkpoint = ModelCheckpoint(dirpath=spec.path("ckpts"), every_n_train_steps=2, save_last=True)
    trainer = Trainer(accelerator="cpu", devices=2,
                      strategy=DDPStrategy(max_restarts=spec.max_restarts, checkpoint_io=checkpoint_io,
                                           zero_stage=spec.zero_stage, async_checkpoint=spec.async_checkpoint),
                      max_epochs=EPOCHS, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=spec.workdir, callbacks=[checkpoint])
    trainer.fit(model, ckpt_path="last" if spec.resume else None)
    return model


def main(argv: list[str]) -> None:
    spec = JobSpec(**json.loads(argv[0]))
    result: dict[str, Any] = {"spec": asdict(spec), "exception": "", "error": ""}
    try:
        model = fit(spec)
        torch.save(model.state_dict(), spec.path("final.pt"))
    except BaseException as error:  # a Preempted (SystemExit 75) too: recorded, then the process exits with it
        result.update(exception=type(error).__name__, error=str(error).strip()[:2000])
        raise
    finally:
        spec.path("result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
