"""Model, optimizer and data of one workload, built the same way by every contender."""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader

from benchmarks.workloads import WORKLOADS, Workload


def workload(args: argparse.Namespace) -> Workload:
    if args.workload not in WORKLOADS:
        raise SystemExit(f"--workload={args.workload!r}: expected one of {sorted(WORKLOADS)}")
    return WORKLOADS[args.workload]


def loader(work: Workload, total_steps: int, ranks: int) -> DataLoader:
    """Sequential (no shuffle), so the distributed samplers of every contender shard it alike:
    rank r gets samples r, r + ranks, ... A plain DataLoader: each framework injects its sampler."""
    dataset = work.dataset(total_steps * work.batch_size * ranks)
    return DataLoader(dataset, batch_size=work.batch_size, shuffle=False, drop_last=True)
