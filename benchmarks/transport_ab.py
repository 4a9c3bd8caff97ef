"""Paired A/B of two versions of the shared-memory transport, inside one pair of ranks.

    python -m benchmarks.transport_ab OLD/strategies/shm_transport.py strategies/shm_transport.py
    python -m benchmarks.transport_ab A.py B.py --wire bf16 --pairs 80

Why: a change to the transport moves an end-to-end step by a few per cent, while whole runs on
this shared machine drift ±20 % from round to round, so separate runs cannot tell. Here both
versions are connected side by side in the same two processes and alternate every iteration
(order swapped every pair), so drift hits both alike. An iteration is a mock of the `mlp`
workload's tail: a 24 MiB bucket is sent, a little compute runs on the main thread (the last
layer's backward), an 8 MiB bucket is sent, and the rank waits for both. Each file is the
all-reduce protocol (`connect_shared_memory` included); the region file it maps comes from the
current tree's `strategies/shm_region.py` (a file from before that split carries its own).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.allreduce_model import free_port

WIRES = {"fp32": None, "bf16": torch.bfloat16}
WARMUP_PAIRS = 3


def _load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import a transport from {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _iteration(transport: Any, buckets: list[torch.Tensor], wire: torch.dtype | None,
               operands: tuple[torch.Tensor, torch.Tensor]) -> float:
    started = time.perf_counter()
    futures = [transport.all_reduce_async(buckets[0], wire)]
    for _ in range(2):
        torch.mm(*operands)  # the compute that overlaps the large bucket
    futures.append(transport.all_reduce_async(buckets[1], wire))
    for future in futures:
        future.wait()
    return time.perf_counter() - started


def _worker(rank: int, port: int, paths: list[str], wire_name: str, pairs: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    transports = [_load(path, f"_transport_{label}").connect_shared_memory(
        None, transport="shared_memory", timeout=timedelta(seconds=60)) for label, path in zip("AB", paths)]
    buckets = [torch.randn(6 * 2**20), torch.randn(2 * 2**20)]  # 24 + 8 MiB, as mlp's last two buckets
    operands = (torch.randn(128, 1024), torch.randn(1024, 1024))
    seconds: list[list[float]] = [[], []]
    for pair in range(pairs + WARMUP_PAIRS):
        for which in ((0, 1) if pair % 2 == 0 else (1, 0)):
            dist.barrier()
            took = _iteration(transports[which], buckets, WIRES[wire_name], operands)
            if pair >= WARMUP_PAIRS:
                seconds[which].append(took)
    if rank == 0:
        speedups = [a / b for a, b in zip(*seconds)]
        print(f"{wire_name}: A {1e3 * statistics.median(seconds[0]):.2f} ms, B {1e3 * statistics.median(seconds[1]):.2f} ms "
              f"per iteration; B's speed-up, median of {len(speedups)} pairs: {statistics.median(speedups):.3f}x "
              f"(B faster in {sum(s > 1 for s in speedups)})")
    for transport in transports:
        transport.close()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="path of version A's shm_transport.py")
    parser.add_argument("b", help="path of version B's shm_transport.py")
    parser.add_argument("--wire", choices=list(WIRES), default="fp32")
    parser.add_argument("--pairs", type=int, default=80)
    args = parser.parse_args()
    mp.spawn(_worker, args=(free_port(), [args.a, args.b], args.wire, args.pairs), nprocs=2)


if __name__ == "__main__":
    main()
