"""The contenders' training loops, one function each, all doing the same arithmetic on one device.

* ``plain``      a hand-written torch loop: no DDP, no framework (the limit the others approach);
* ``torch_ddp``  the same loop around `DistributedDataParallel` at world size 1 (nccl on a GPU);
* ``lightning``  `pytorch_lightning.Trainer(strategy="ddp", devices=1)`;
* ``ours``       our `Trainer(strategy=DDPStrategy(), devices=1)`.

Each compiles the way its users are told to: `torch.compile(model)` for the plain loop,
`torch.compile(DistributedDataParallel(model))` for torch DDP (its graph is split at DDP's buckets),
and the LightningModule itself for both Trainers. bf16-mixed is autocast around forward and loss.
Every loop reports each step to the session and stops when the session says so.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from benchmarks.gpu.models import GpuWorkload, cycle, loss_of
from benchmarks.gpu.session import Session

Loop = Callable[[GpuWorkload, torch.device, str, bool, Session], None]


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def compiled_module(model: torch.nn.Module) -> torch.nn.Module:
    compiled: torch.nn.Module = torch.compile(model)  # type: ignore[assignment]
    return compiled


def _hand_written(model: torch.nn.Module, work: GpuWorkload, device: torch.device, precision: str,
                  session: Session) -> None:
    optimizer = work.optimizer_for(model)
    for batch in cycle(work.batches(device)):
        session.step_start()
        optimizer.zero_grad(set_to_none=True)
        with autocast(precision, device):
            loss = loss_of(model, batch)
        loss.backward()
        optimizer.step()
        if not session.step_end(loss):
            return


def plain(work: GpuWorkload, device: torch.device, precision: str, compiled: bool, session: Session) -> None:
    model = work.model(device)
    _hand_written(compiled_module(model) if compiled else model, work, device, precision, session)


def torch_ddp(work: GpuWorkload, device: torch.device, precision: str, compiled: bool, session: Session) -> None:
    from torch.nn.parallel import DistributedDataParallel

    _one_rank_group(device)
    wrapped: torch.nn.Module = DistributedDataParallel(
        work.model(device), device_ids=[device.index] if device.type == "cuda" else None)
    _hand_written(compiled_module(wrapped) if compiled else wrapped, work, device, precision, session)


def _one_rank_group(device: torch.device) -> None:
    """World size 1, kept for the process's life (every torch DDP stretch of this contender uses it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)


# ---------------------------------------------------------------------- the two Trainers
class DeviceBatches(IterableDataset):
    """The workload's batches, already on the device, forever (the session decides when to stop)."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        return cycle(self.batches)


class StepsBody:
    """The LightningModule body both Trainers run (mixed in before each framework's class)."""

    def __init__(self, work: GpuWorkload) -> None:
        super().__init__()
        self.work = work
        self.model = work.model(torch.device("cpu"))  # the Trainer moves it, as users leave it to

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return loss_of(self.model, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.work.optimizer_for(self.model)


class SessionHooks:
    """The callback body both Trainers run: the session's step marks, and a stop when it says so."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.session.step_start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if not self.session.step_end(loss):
            trainer.should_stop = True


# What both Trainers run without: their figures are the training loop's (benchmarks/step_overhead.py
# --gpu-settings prices the same loop on the CPU).
QUIET_TRAINER: dict[str, Any] = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                                 "enable_model_summary": False, "num_sanity_val_steps": 0}


def _trainer_arguments(device: torch.device, precision: str, session: Session, hooks: type) -> dict[str, Any]:
    """What both Trainers get: one device, DDP, no logger, checkpoints, progress bar or summary."""
    return {"accelerator": device.type, "devices": 1, "precision": precision, "max_steps": 10**9,
            "callbacks": [hooks(session)], **QUIET_TRAINER}


def _fit(trainer: Any, module: torch.nn.Module, work: GpuWorkload, device: torch.device, compiled: bool) -> None:
    data = DataLoader(DeviceBatches(work.batches(device)), batch_size=None)
    trainer.fit(compiled_module(module) if compiled else module, train_dataloaders=data)


def lightning(work: GpuWorkload, device: torch.device, precision: str, compiled: bool, session: Session) -> None:
    import pytorch_lightning as pl

    module = type("LightningSteps", (StepsBody, pl.LightningModule), {})(work)
    hooks = type("LightningSessionHooks", (SessionHooks, pl.Callback), {})
    trainer = pl.Trainer(strategy="ddp", **_trainer_arguments(device, precision, session, hooks))
    _fit(trainer, module, work, device, compiled)


def ours(work: GpuWorkload, device: torch.device, precision: str, compiled: bool, session: Session) -> None:
    from strategies import DDPStrategy
    from trainer import LightningModule, Trainer
    from trainer.callbacks import Callback

    module = type("OurSteps", (StepsBody, LightningModule), {})(work)
    hooks = type("OurSessionHooks", (SessionHooks, Callback), {})
    trainer = Trainer(strategy=DDPStrategy(), **_trainer_arguments(device, precision, session, hooks))
    _fit(trainer, module, work, device, compiled)


LOOPS: dict[str, Loop] = {"plain": plain, "torch_ddp": torch_ddp, "lightning": lightning, "ours": ours}
LABELS = {"plain": "plain torch loop", "torch_ddp": "torch DDP (world 1)", "lightning": "Lightning ddp",
          "ours": "ours (DDPStrategy)"}
