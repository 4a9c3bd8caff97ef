"""Gradients averaged where autograd left them, against copied into buckets first, in the same ranks (#37).

Two CPU ranks train a benchmark workload with our GradReducer over the shared-memory transport; every few
steps the reducer switches between the two ways it has had of feeding the transport: since e7ab5a0 each
gradient is handed over where it is and divided on its way into the transport's slots (`in place`), before
that it was first copied, divided, into its bucket slot (`copy`). Both ways run in the same processes,
alternating in blocks, so the machine's drift (on a shared 2-core VM, a run can be 30 % slower than the one
before) hits both alike; the figure is each mode's median step on rank 0 and their ratio. No Trainer: the
step is zero_grad, forward, backward (with the reducer), optimizer step.

    python -m benchmarks.reducer_ab --workload mlp --blocks 20 --block-steps 5
    python -m benchmarks.reducer_ab --workload gpt --blocks 10 --block-steps 3

The switch sets the reducer's private mode flags; it measures the two data paths, nothing else changes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.allreduce_model import free_port
from benchmarks.workloads import WORKLOADS, loss_fn, make_optimizer
from strategies.reducer import GradReducer


def _use_in_place(reducer: GradReducer, in_place: bool) -> None:
    """The reducer's two data paths (see GradReducer.__init__): in place, or copied and divided into slots."""
    missing = [name for name in ("_in_place", "_divides", "_divisor", "_state") if not hasattr(reducer, name)]
    if missing:
        raise AttributeError(f"GradReducer no longer has {missing}: update benchmarks/reducer_ab.py's switch.")
    reducer._in_place = in_place
    reducer._divides = reducer._state.prescaled and not in_place
    reducer._divisor = reducer.world_size if reducer._divides else 1


def _worker(rank: int, port: int, workload: str, blocks: int, block_steps: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    work = WORKLOADS[workload]
    model = work.model()
    optimizer = make_optimizer(work, model)
    reducer = GradReducer(model)
    batch = work.make_inputs(work.batch_size, torch.Generator().manual_seed(rank))
    steps: dict[bool, list[float]] = {True: [], False: []}
    for block in range(blocks + 2):  # the first two blocks warm up (and rebuild the buckets)
        in_place = block % 2 == 1
        _use_in_place(reducer, in_place)
        for _ in range(block_steps):
            started = time.perf_counter()
            optimizer.zero_grad()
            loss = loss_fn(model, batch)
            reducer.prepare_for_backward(loss)
            loss.backward()
            reducer.finish_backward()
            optimizer.step()
            if block >= 2:
                steps[in_place].append(time.perf_counter() - started)
    if rank == 0:
        in_place_ms, copy_ms = (statistics.median(steps[mode]) * 1e3 for mode in (True, False))
        print(f"{workload}: rank 0 median step, in place {in_place_ms:.1f} ms, copied into buckets {copy_ms:.1f} ms: "
              f"copy / in place = {copy_ms / in_place_ms:.3f} (load {os.getloadavg()[0]:.2f})")
    reducer.remove()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp")
    parser.add_argument("--blocks", type=int, default=20, help="measured blocks, alternating modes")
    parser.add_argument("--block-steps", type=int, default=5)
    args = parser.parse_args()
    mp.spawn(_worker, args=(free_port(), args.workload, args.blocks, args.block_steps), nprocs=2)


if __name__ == "__main__":
    main()
