"""The cost model of docs/scaling.md, and the measurement that checks it.

    python -m benchmarks.allreduce_model            # measure here (2 gloo ranks), then the model tables
    python -m benchmarks.allreduce_model --no-measure

Model. One ring all-reduce of `b` bytes over `N` ranks moves 2(N-1)/N * b bytes through every
rank's slowest link and takes 2(N-1) latency-bound steps:

    t(b, N) = 2(N-1) * alpha  +  2(N-1)/N * b / bandwidth

Our reducer launches buckets (the first `first_bucket_cap_mb`, then `bucket_cap_mb` each) in
order as backward produces their gradients, and the comm stream runs them one after the other,
so the exposed communication of a step is what is left after the last gradient is ready:

    ready_i = T_bwd * (bytes of buckets 0..i) / (all bytes)      gradients arrive at a steady rate
    end_i   = max(ready_i, end_{i-1}) + t(b_i, N)
    step    = T_fwd + T_bwd + max(0, end_last - T_bwd)

The measurement fits `alpha` and `bandwidth` to all-reduce times of 4 KiB..64 MiB on 2 gloo
ranks, then predicts a bucketed gradient reduction and measures it. At N = 2 the factor
2(N-1)/N is 1, so what this checks is the form of the model (a fixed cost per collective plus
bytes over bandwidth, summed over buckets), not its growth with N.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

MiB = 1 << 20
SIZES = [4096 << k for k in range(15)]  # 4 KiB .. 64 MiB


# ---------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Link:
    """A ring's bottleneck: per-step latency (s) and bus bandwidth (bytes/s)."""

    alpha: float
    bandwidth: float

    def allreduce(self, nbytes: float, ranks: int, tree_latency: bool = False) -> float:
        """Ring bandwidth term; the latency term of a ring, or of a tree (2 log2 N steps) if asked."""
        if ranks < 2:
            return 0.0
        steps = 2 * max(1, (ranks - 1).bit_length()) if tree_latency else 2 * (ranks - 1)
        return steps * self.alpha + 2 * (ranks - 1) / ranks * nbytes / self.bandwidth


def bucket_sizes(total_bytes: float, bucket_cap_mb: float = 25, first_bucket_cap_mb: float = 1) -> list[float]:
    """Our reducer's plan for a model whose gradients are many small tensors (caps are in MiB)."""
    sizes, left = [], total_bytes
    cap = first_bucket_cap_mb * MiB
    while left > 0:
        sizes.append(min(cap, left))
        left -= sizes[-1]
        cap = bucket_cap_mb * MiB
    return sizes


def exposed_comm(sizes: list[float], backward_s: float, cost: list[float]) -> float:
    """Communication left after backward ends, with buckets launched in order as they fill."""
    total, done, end = sum(sizes), 0.0, 0.0
    for size, seconds in zip(sizes, cost):
        done += size
        end = max(backward_s * done / total, end) + seconds
    return max(0.0, end - backward_s)


@dataclass(frozen=True)
class Workload:
    name: str
    grad_bytes: float
    forward_s: float
    backward_s: float


@dataclass(frozen=True)
class Cluster:
    """8 GPUs per node: one node rides NVLink, more nodes are bound by the per-GPU NIC."""

    gpus_per_node: int = 8
    intra: Link = Link(alpha=2e-6, bandwidth=400e9)  # NVLink 4 bus bandwidth NCCL reaches, H100 SXM
    inter: Link = Link(alpha=6e-6, bandwidth=45e9)  # one 400 Gb/s NIC per GPU, ~90 % of line rate

    def link(self, ranks: int) -> Link:
        return self.intra if ranks <= self.gpus_per_node else self.inter


def step_model(work: Workload, ranks: int, cluster: Cluster, bucket_cap_mb: float = 25,
               tree_latency: bool = False) -> dict[str, float]:
    """Per-step times (ms) of one workload at `ranks` GPUs, weak scaling (same batch per GPU)."""
    sizes = bucket_sizes(work.grad_bytes, bucket_cap_mb)
    link = cluster.link(ranks)
    cost = [link.allreduce(size, ranks, tree_latency) for size in sizes]
    exposed = exposed_comm(sizes, work.backward_s, cost)
    compute = work.forward_s + work.backward_s
    return {"buckets": len(sizes), "comm_ms": 1e3 * sum(cost), "exposed_ms": 1e3 * exposed,
            "step_ms": 1e3 * (compute + exposed), "efficiency": compute / (compute + exposed)}


WORKLOADS = [
    Workload("ResNet-50 (25.6M params, fp32 grads, 256 img/GPU)", 25.6e6 * 4, 0.030, 0.060),
    Workload("GPT 1.3B (fp32 grads, 16k tokens/GPU)", 1.3e9 * 4, 0.107, 0.213),
    Workload("GPT 1.3B, comm_hook='bf16'", 1.3e9 * 2, 0.107, 0.213),
]


def model_tables(cluster: Cluster, gpus: tuple[int, ...] = (8, 64, 512, 1024)) -> str:
    lines = []
    for work in WORKLOADS:
        lines += [f"\n{work.name}: compute {1e3 * (work.forward_s + work.backward_s):.0f} ms/step, "
                  f"gradients {work.grad_bytes / 1e9:.2f} GB",
                  "| GPUs | buckets | ring comm (ms) | exposed (ms) | step (ms) | efficiency "
                  "| tree-latency exposed (ms) | efficiency | 100 MiB buckets, ring: exposed (ms) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n in gpus:
            ring = step_model(work, n, cluster)
            tree = step_model(work, n, cluster, tree_latency=True)
            big = step_model(work, n, cluster, bucket_cap_mb=100)
            lines.append(f"| {n} | {ring['buckets']:.0f} | {ring['comm_ms']:.1f} | {ring['exposed_ms']:.1f} | "
                         f"{ring['step_ms']:.1f} | {ring['efficiency']:.0%} | {tree['exposed_ms']:.1f} | "
                         f"{tree['efficiency']:.0%} | {big['exposed_ms']:.1f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the measurement
def _typical(samples: list[float]) -> float:
    """The lower quartile: on a shared 2-core machine other processes only ever add time, so
    the quieter runs are the ones that measure the collective rather than the neighbours."""
    return statistics.quantiles(samples, n=4)[0]


def _time_allreduce(nbytes: int, reps: int) -> float:
    import torch
    import torch.distributed as dist

    tensor = torch.ones(nbytes // 4)
    for _ in range(2):
        dist.all_reduce(tensor)
    samples = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        samples.append(time.perf_counter() - start)
    return _typical(samples)


def _time_buckets(sizes: list[int], reps: int) -> float:
    """All buckets launched async in order, then waited on: what the reducer does at backward end."""
    import torch
    import torch.distributed as dist

    tensors = [torch.ones(size // 4) for size in sizes]
    samples = []
    for _ in range(reps + 1):
        dist.barrier()
        start = time.perf_counter()
        for work in [dist.all_reduce(tensor, async_op=True) for tensor in tensors]:
            work.wait()
        samples.append(time.perf_counter() - start)
    return _typical(samples[1:])


def _measure_rank(rank: int, world: int, port: int, out: str, bucket_total: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        times = {size: _time_allreduce(size, reps=41 if size <= 4 * MiB else 15) for size in SIZES}
        plan = [int(size) for size in bucket_sizes(bucket_total)]
        bucketed = _time_buckets(plan, reps=15)
        if rank == 0:
            Path(out).write_text(json.dumps({"world": world, "times": times, "plan": plan, "bucketed": bucketed}))
    finally:
        dist.destroy_process_group()


def measure(world: int = 2, bucket_total: int = 32 * MiB) -> dict:
    """Spawn `world` gloo ranks on this machine; return rank 0's timings."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "result.json"))
        mp.start_processes(_measure_rank, args=(world, free_port(), out, bucket_total), nprocs=world,
                           start_method="spawn")
        result = json.loads(Path(out).read_text())
    result["times"] = {int(size): seconds for size, seconds in result["times"].items()}
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fit_link(times: dict[int, float], ranks: int) -> Link:
    """Least squares on relative error (weights 1/t^2), so 4 KiB and 64 MiB count alike."""
    xs = [2 * (ranks - 1) / ranks * size for size in times]
    ts = list(times.values())
    w = [1 / t ** 2 for t in ts]
    s0, s1, s2 = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * x * x for wi, x in zip(w, xs))
    b0, b1 = sum(wi * t for wi, t in zip(w, ts)), sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = s0 * s2 - s1 * s1
    intercept, slope = (b0 * s2 - b1 * s1) / det, (s0 * b1 - s1 * b0) / det
    return Link(alpha=intercept / (2 * (ranks - 1)), bandwidth=1 / slope)


def report_measurement(result: dict) -> str:
    ranks, times = result["world"], result["times"]
    link = fit_link(times, ranks)
    lines = [f"measured on {ranks} gloo ranks (CPU, 1 thread each): alpha = {1e6 * link.alpha:.0f} us per step "
             f"(so {1e6 * 2 * (ranks - 1) * link.alpha:.0f} us per all-reduce), bandwidth = "
             f"{link.bandwidth / 1e9:.2f} GB/s",
             "| bytes | measured (ms) | model (ms) | error |", "|---:|---:|---:|---:|"]
    for size, seconds in times.items():
        predicted = link.allreduce(size, ranks)
        lines.append(f"| {size / 1024:.0f} KiB | {1e3 * seconds:.3f} | {1e3 * predicted:.3f} | "
                     f"{predicted / seconds - 1:+.0%} |")
    plan = result["plan"]
    predicted = sum(link.allreduce(size, ranks) for size in plan)
    lines.append(f"\nbucketed reduction of {sum(plan) / MiB:.0f} MiB in {len(plan)} buckets "
                 f"({', '.join(f'{size / MiB:.0f}' for size in plan)} MiB): measured {1e3 * result['bucketed']:.1f} ms,"
                 f" model {1e3 * predicted:.1f} ms ({predicted / result['bucketed'] - 1:+.0%})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-measure", action="store_true", help="print the model tables only")
    parser.add_argument("--json", type=Path, help="also write the raw measurement here")
    args = parser.parse_args()
    if not args.no_measure:
        result = measure()
        print(report_measurement(result))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    cluster = Cluster()
    print(f"\nmodel: {cluster.gpus_per_node} GPUs/node; NVLink alpha {1e6 * cluster.intra.alpha:.0f} us, "
          f"{cluster.intra.bandwidth / 1e9:.0f} GB/s; network alpha {1e6 * cluster.inter.alpha:.0f} us, "
          f"{cluster.inter.bandwidth / 1e9:.0f} GB/s per GPU; bucket_cap_mb=25, first_bucket_cap_mb=1")
    print(model_tables(cluster))


if __name__ == "__main__":
    main()
