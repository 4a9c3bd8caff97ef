"""The hand-written baseline: torch.multiprocessing.spawn + DistributedDataParallel, as in the
PyTorch DDP tutorial, with torch's default DDP settings (bucket_cap_mb=25, grads copied into buckets).
Its DistributedSampler shuffles, seeded as the Trainers' injected samplers are, so every contender
trains on the same batches."""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from benchmarks.contenders.data import device_for, loader, train_raw, workload
from benchmarks.probe import Probe, parse_args
from benchmarks.workloads import make_optimizer
from strategies.sampler import SEED_VARIABLE
from strategies.worker import cpu_threads_per_rank  # each rank's share of the cores, as ours and Lightning take it


SEED = int(os.environ.get(SEED_VARIABLE, 0))  # the seed both Trainers' training samplers use


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(cpu_threads_per_rank(args.devices))
    device = device_for(args, local_rank=rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.devices)
    train(args, rank, device)
    dist.destroy_process_group()


def train(args: argparse.Namespace, rank: int, device: torch.device) -> None:
    """One fit in this rank, in the process group that is already up (also run by benchmarks.loop_ab)."""
    probe, work = Probe(args), workload(args)
    model = DistributedDataParallel(work.model().to(device), device_ids=[rank] if device.type == "cuda" else None)
    if args.compile:  # torch's recipe: compile the DDP module, whose graph dynamo splits at DDP's buckets
        model = torch.compile(model, backend=args.compile)  # type: ignore[assignment]
    optimizer = make_optimizer(work, model)
    data = loader(work, probe.total_steps, args.devices)
    data = torch.utils.data.DataLoader(data.dataset, batch_size=work.batch_size, drop_last=True,
                                       sampler=DistributedSampler(data.dataset, shuffle=True, seed=SEED))
    train_raw(model, optimizer, data, probe, rank, args, device)


def main() -> None:
    args = parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(worker, args=(args, port), nprocs=args.devices)


if __name__ == "__main__":
    main()
