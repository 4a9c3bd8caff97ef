"""All-reduce alone, gloo against our shared-memory transport, on 2 spawned CPU ranks; and the reduce-scatter
ZeRO uses instead (its shard in place: strategies/zero_reducer.py), through both.

    python -m benchmarks.allreduce_micro                 # 32 MiB, slots of 16/2/1 MiB, 20 repeats
    python -m benchmarks.allreduce_micro --mib 8 --slots-mib 2

Prints the median wall time and CPU time (this process, all threads) per all-reduce. Used to
choose the transport's slot size; the README of this folder quotes it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.allreduce_model import free_port
from strategies.shm_transport import connect_shared_memory


def _timed(reduce: Callable[[], None], repeats: int) -> tuple[float, float]:
    for _ in range(3):
        reduce()
    dist.barrier()
    walls, cpus = [], []
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        reduce()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return 1e3 * statistics.median(walls), 1e3 * statistics.median(cpus)


def _worker(rank: int, port: int, mib: float, slots_mib: list[float], repeats: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    tensor = torch.full((int(mib * 2**18),), float(rank + 1))
    mine = tensor.view(2, -1)[rank]
    rows = [("gloo", _timed(lambda: dist.all_reduce(tensor), repeats)),
            ("gloo reduce_scatter_single", _timed(lambda: dist.reduce_scatter_single(mine, tensor), repeats))]
    for slot_mib in slots_mib:
        transport = connect_shared_memory(None, transport="shared_memory", timeout=timedelta(seconds=60),
                                          slot_bytes=int(slot_mib * 2**20))
        assert transport is not None
        rows.append((f"shared memory, {slot_mib:g} MiB slots",
                     _timed(lambda: transport.all_reduce_async(tensor).wait(), repeats)))
        rows.append(("  its reduce-scatter", _timed(lambda: transport.reduce_scatter_async(tensor, mine).wait(),
                                                     repeats)))
        transport.close()
    if rank == 0:
        print(f"{mib:g} MiB all-reduce (and reduce-scatter), 2 ranks, median of {repeats}:")
        for name, (wall, cpu) in rows:
            print(f"  {name:34s} wall {wall:6.2f} ms   cpu {cpu:6.2f} ms")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=32.0)
    parser.add_argument("--slots-mib", type=float, nargs="+", default=[16.0, 2.0, 1.0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    mp.spawn(_worker, args=(free_port(), args.mib, args.slots_mib, args.repeats), nprocs=2)


if __name__ == "__main__":
    main()
