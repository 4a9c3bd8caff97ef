"""The LightningModule and probe callback of the pytorch_lightning contenders (importable by name,
since Lightning's "ddp" re-runs the command for the other ranks)."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch

from benchmarks.probe import Probe
from benchmarks.workloads import BenchSteps, Workload


class BenchModule(BenchSteps, pl.LightningModule):
    pass


class ProbeCallback(pl.Callback):
    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.loss: float | None = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.probe.step_end(batch)
        if len(self.probe.ends) == self.probe.total_steps:
            self.loss = float(outputs["loss"].detach())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.probe.finish(trainer.global_rank, self.loss, {"threads": torch.get_num_threads()})


def fit(strategy: Any, args: Any, work: Workload, probe: Probe, loader: Any) -> None:
    """The same Trainer settings as our contenders: no logger, checkpoints, progress bar or summary."""
    trainer = pl.Trainer(accelerator=args.accelerator, precision=args.precision, devices=args.devices,
                         strategy=strategy, max_steps=probe.total_steps,
                         callbacks=[ProbeCallback(probe)], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=args.out)
    module = BenchModule(work)
    trainer.fit(torch.compile(module, backend=args.compile) if args.compile else module, train_dataloaders=loader)
