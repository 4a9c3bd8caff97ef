"""Model, optimizer and data of one workload, built the same way by every contender."""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader

from benchmarks.probe import Probe
from benchmarks.workloads import WORKLOADS, Workload, loss_fn


def workload(args: argparse.Namespace) -> Workload:
    if args.workload not in WORKLOADS:
        raise SystemExit(f"--workload={args.workload!r}: expected one of {sorted(WORKLOADS)}")
    return WORKLOADS[args.workload]


def loader(work: Workload, total_steps: int, ranks: int) -> DataLoader:
    """Sequential (no shuffle), so the distributed samplers of every contender shard it alike:
    rank r gets samples r, r + ranks, ... A plain DataLoader: each framework injects its sampler."""
    dataset = work.dataset(total_steps * work.batch_size * ranks)
    return DataLoader(dataset, batch_size=work.batch_size, shuffle=False, drop_last=True)


def train_raw(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: DataLoader, probe: Probe,
              rank: int) -> None:
    """The framework-free loop of the baselines (one process, hand-written torch DDP): exactly the
    arithmetic every framework contender also does, timed by the probe."""
    loss = torch.zeros(())
    for step, batch in enumerate(batches):
        if step == probe.total_steps:
            break
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        probe.step_end()
    probe.finish(rank, float(loss.detach()), {"threads": torch.get_num_threads()})
