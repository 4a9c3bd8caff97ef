"""Functions that `strategy.launch` runs inside spawned workers.

They live here, at module level of an importable package, because elastic's `spawn` workers
unpickle them by qualified name; a function defined inside a test module could be re-imported
under a different name by pytest's import mode.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies import DDPStrategy
from strategies.worker import STOP_SIGNALS


def ranks_and_pids(strategy: DDPStrategy) -> dict[str, Any]:
    """Report what this worker sees; collects every rank's answer through all_gather_object."""
    mine = {"pid": os.getpid(), "rank": strategy.global_rank, "local_rank": strategy.local_rank,
            "world_size": strategy.world_size, "threads": torch.get_num_threads(),
            "backend": dist.get_backend(), "environment": type(strategy.environment).__name__}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {"ranks": everyone, "rank0_pid": os.getpid()}


class TinyNet(nn.Module):
    def __init__(self, hidden: int = 4) -> None:
        super().__init__()
        self.layer = nn.Linear(3, hidden)
        self.head = nn.Linear(hidden, 1)
        self.register_buffer("running", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.layer(x)))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.get_buffer("running").add_(1 + dist.get_rank())  # diverges per rank unless buffers are broadcast
        return self(batch).pow(2).mean()


def setup_module_and_train(strategy: DDPStrategy) -> dict[str, Any]:
    """Ranks start from different weights and data; after setup_module and each step they agree."""
    torch.manual_seed(100 + strategy.global_rank)
    module = strategy.setup_module(TinyNet())
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    setup_params = strategy.all_gather(flat)
    grads_equal = []
    for step in range(2):
        batch = torch.randn(5, 3) * (1 + strategy.global_rank)
        loss = strategy.training_step(module, batch, step)
        strategy.backward(loss)
        grads = torch.cat([p.grad.reshape(-1) for p in module.parameters() if p.grad is not None])
        gathered = strategy.all_gather(grads)
        grads_equal.append(bool(torch.equal(gathered[0], gathered[1])))
    return {
        "setup_equal": bool(torch.equal(setup_params[0], setup_params[1])),
        "rank0_kept_its_init": bool(torch.equal(setup_params[0], _rank0_init_params())),
        "grads_equal": grads_equal,
        "buffers": strategy.all_gather(module.get_buffer("running")).tolist(),
        "summary": strategy.summary(),
    }


def _rank0_init_params() -> torch.Tensor:
    torch.manual_seed(100)
    return torch.cat([p.detach().reshape(-1) for p in TinyNet().parameters()])


def private_copies(strategy: DDPStrategy, parent_model: nn.Module) -> list[float]:
    """A model built in the parent must arrive as a private copy in each worker: rank 1's
    in-place change must not show on rank 0 (shared memory would make every rank step twice)."""
    before = float(parent_model.get_parameter("layer.weight").sum())
    if strategy.global_rank == 1:
        with torch.no_grad():
            parent_model.get_parameter("layer.weight").add_(1.0)
    strategy.barrier()
    return gather_all(strategy, float(parent_model.get_parameter("layer.weight").sum()) - before)


def everything(strategy: DDPStrategy, checkpoint_path: str, parent_model: nn.Module) -> dict[str, Any]:
    """One launch for several tests: process start-up dominates the cost."""
    return {"private": private_copies(strategy, parent_model),
            "ranks": ranks_and_pids(strategy), "train": setup_module_and_train(strategy),
            "collectives": gather_all(strategy, collectives(strategy)),
            "checkpoint": save_and_load_checkpoint(strategy, checkpoint_path)}


def gather_all(strategy: DDPStrategy, mine: Any) -> list[Any]:
    everyone: list[Any] = [None] * strategy.world_size
    dist.all_gather_object(everyone, mine)
    return everyone


def collectives(strategy: DDPStrategy) -> dict[str, Any]:
    rank = strategy.global_rank
    value = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
    strategy.barrier("start")
    return {
        "mean": strategy.reduce(value, reduce_op="mean").tolist(),
        "sum": strategy.reduce(value, reduce_op="sum").tolist(),
        "max": strategy.reduce(value, reduce_op="max").tolist(),
        "min": strategy.reduce(value, reduce_op="min").tolist(),
        "int_mean": strategy.reduce(torch.tensor(rank), reduce_op="mean").item(),
        "gather": strategy.all_gather(torch.tensor([rank, rank * 2])).tolist(),
        "broadcast": strategy.broadcast({"from": rank, "items": [rank] * 3}, src=1),
        "input_unchanged": value.tolist() == [float(rank + 1), 10.0 * (rank + 1)],
    }


def save_and_load_checkpoint(strategy: DDPStrategy, path: str) -> dict[str, Any]:
    """Every rank calls save_checkpoint; only rank 0 may write. Then every rank reads it."""
    original_save = strategy.checkpoint_io.save
    writers: list[int] = []

    def spying_save(checkpoint: dict[str, Any], target: Any) -> None:
        writers.append(strategy.global_rank)
        original_save(checkpoint, target)

    strategy.checkpoint_io.save = spying_save  # type: ignore[method-assign,assignment]
    strategy.save_checkpoint({"weights": torch.arange(4.0) + strategy.global_rank, "step": 7}, path)
    loaded = strategy.load_checkpoint(path)
    everyone: list[Any] = [None] * strategy.world_size
    dist.all_gather_object(everyone, {"writers": writers, "weights": loaded["weights"].tolist(),
                                      "step": loaded["step"]})
    return {"ranks": everyone}


def mismatched_parameters(strategy: DDPStrategy) -> None:
    strategy.setup_module(TinyNet(hidden=4 + strategy.global_rank))


def raise_on_rank_one(strategy: DDPStrategy, pid_dir: str) -> None:
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    if strategy.global_rank == 1:
        raise ValueError("boom from rank one")
    strategy.barrier()  # rank 0 waits for a peer that is gone: must not hang
    time.sleep(60)


def sigkill_rank_one(strategy: DDPStrategy, pid_dir: str) -> None:
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    strategy.barrier()
    if strategy.global_rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # rank 0 idles: the launcher must stop it


def record_pid_and_sleep(strategy: DDPStrategy, pid_dir: str) -> None:
    Path(pid_dir, f"{strategy.global_rank}.pid").write_text(str(os.getpid()))
    time.sleep(60)  # only a stop from outside ends this in time


def start_facts(strategy: DDPStrategy, variable: str) -> list[Any]:
    """Every rank's parent pid (who started it) and its view of `variable` in os.environ."""
    return gather_all(strategy, {"ppid": os.getppid(), "pid": os.getpid(), "cwd": os.getcwd(),
                                 "variable": os.environ.get(variable)})


def stop_signal_handlers(strategy: DDPStrategy) -> list[Any]:
    """Every rank's handler for the signals torch elastic stops workers with, by name (while a stage
    runs, the strategy's preemption signals are held as notices: strategies/preemption.py)."""
    from strategies.notice_signals import _hold

    names = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored", signal.default_int_handler: "KeyboardInterrupt",
             _hold: "preemption notice"}
    mine: dict[str, Any] = {sig.name: names.get(signal.getsignal(sig), "other")
                            for sig in STOP_SIGNALS}
    mine["ppid"] = os.getppid()
    return gather_all(strategy, mine)


def unseeded_numpy_draw(strategy: DDPStrategy) -> list[Any]:
    """Every rank's first draw from numpy's global generator, which nobody seeded."""
    import numpy

    return gather_all(strategy, {"draw": float(numpy.random.rand()), "ppid": os.getppid()})


def return_rank(strategy: DDPStrategy) -> int:
    return strategy.global_rank


def shard_indices(rank: int, world_size: int, size: int) -> dict[str, Any]:
    """For `run_on_ranks`: the indices this rank's distributed loader yields in epochs 0, 0, 1."""
    from torch.utils.data import DataLoader, TensorDataset

    from strategies.sampler import distribute_dataloader

    dataset = TensorDataset(torch.arange(size))
    loader = distribute_dataloader(DataLoader(dataset, batch_size=2, shuffle=True), world_size, rank, seed=5)
    sequential = distribute_dataloader(DataLoader(dataset, batch_size=2), world_size, rank)

    def epoch(which: DataLoader, number: int) -> list[int]:
        which.sampler.set_epoch(number)  # type: ignore[attr-defined]
        return [int(i) for (batch,) in which for i in batch]

    return {"epoch0": epoch(loader, 0), "epoch0_again": epoch(loader, 0), "epoch1": epoch(loader, 1),
            "sequential": epoch(sequential, 0), "batches": len(loader)}


def loader_worker_start(strategy: DDPStrategy) -> list[Any]:
    """Every rank's default start method for the processes it starts, and how one DataLoader worker
    process of this rank was started (its parent is this rank when forked)."""
    import multiprocessing

    from torch.utils.data import DataLoader

    loader = DataLoader(_ParentPid(), batch_size=1, num_workers=1)
    parent = int(next(iter(loader))[0])
    return gather_all(strategy, {"default": multiprocessing.get_start_method(),
                                 "forked_from_rank": parent == os.getpid()})


class _ParentPid(torch.utils.data.Dataset):
    """One item: the parent pid of the process that loads it."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        return os.getppid()
