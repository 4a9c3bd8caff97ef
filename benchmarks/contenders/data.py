"""Model, optimizer and data of one workload, built the same way by every contender."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

import torch
from torch.utils.data import DataLoader

from benchmarks.probe import Probe
from benchmarks.workloads import WORKLOADS, Workload, loss_fn


def workload(args: argparse.Namespace) -> Workload:
    """The named workload, with `--batch-size` (per rank) in place of its own if given."""
    if args.workload not in WORKLOADS:
        raise SystemExit(f"--workload={args.workload!r}: expected one of {sorted(WORKLOADS)}")
    work = WORKLOADS[args.workload]
    return dataclasses.replace(work, batch_size=args.batch_size) if args.batch_size else work


def device_for(args: argparse.Namespace, local_rank: int = 0) -> torch.device:
    """What a hand-written loop trains on: the CPU, or its rank's GPU (as the frameworks pick)."""
    if args.accelerator == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def autocast(args: argparse.Namespace, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16-mixed as the frameworks do it: forward and loss under autocast, backward outside."""
    if args.precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loader(work: Workload, total_steps: int, ranks: int) -> DataLoader:
    """A plain DataLoader: each framework injects its training sampler, which shuffles whatever the loader
    says (Lightning's rule, ours too), seeded alike; the hand-written torch DDP contender builds the same."""
    dataset = work.dataset(total_steps * work.batch_size * ranks)
    return DataLoader(dataset, batch_size=work.batch_size, shuffle=False, drop_last=True)


def train_raw(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: DataLoader, probe: Probe,
              rank: int, args: argparse.Namespace, device: torch.device) -> None:
    """The framework-free loop of the baselines (one process, hand-written torch DDP): exactly the
    arithmetic every framework contender also does, timed by the probe."""
    loss = torch.zeros(())
    for step, batch in enumerate(batches):
        if step == probe.total_steps:
            break
        optimizer.zero_grad(set_to_none=True)
        with autocast(args, device):
            loss = loss_fn(model, [tensor.to(device, non_blocking=True) for tensor in batch])
        loss.backward()
        optimizer.step()
        probe.step_end(batch)
    probe.finish(rank, float(loss.detach()), {"threads": torch.get_num_threads()})
