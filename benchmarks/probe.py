"""What every rank of every contender measures, identically, and writes to `<out>/rank<r>.json`.

The harness passes the wall-clock instant it started the contender's process (`--t0`), so
launch -> first step covers interpreter start, imports, process launch, rendezvous, model setup
and the first step. Throughput is timed on rank 0 from the end of the last warm-up step to the
end of the last step (steady state); peak RSS comes from `getrusage` in each rank.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None, **extra: type) -> argparse.Namespace:
    """The common contender command line (plus `extra` options, e.g. comm_hook=str)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", required=True)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="measured steps after the warm-up")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    parser.add_argument("--batch-size", type=int, default=None, help="per rank (default: the workload's)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--t0", type=float, default=None, help="time.time() when the harness started us")
    parser.add_argument("--compile", default=None, help="torch.compile the model with this backend (inductor); "
                        "its compile time lands in launch -> first step, not in the steady-state steps")
    for name, kind in extra.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None)
    return parser.parse_args(argv)


class Probe:
    """Call `step_end(batch)` after every optimizer step and `finish(rank, loss)` once at the end."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.warmup, self.steps = args.warmup, args.steps
        self.out = Path(args.out)
        self.t0 = args.t0 if args.t0 is not None else time.time()
        self.ends: list[float] = []
        self.batch_size: int | None = None  # as the contender's loop saw it, not as asked
        self.first_step_wall: float | None = None
        self.rss_after_first_step: float | None = None
        self.hwm_after_first_step: float | None = None

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    def step_end(self, batch: Any) -> None:
        """`batch` is the step's (inputs, targets): samples/s counts what was really trained on."""
        if len(self.ends) + 1 in (max(self.warmup, 1), self.total_steps):
            _wait_for_the_gpu()  # the measured interval's two ends: the device's work, not just its queue
        self.ends.append(time.perf_counter())
        self.batch_size = len(batch[0])
        if self.first_step_wall is None:
            self.first_step_wall = time.time()
            self.rss_after_first_step = _status_mib("VmRSS")
            self.hwm_after_first_step = _status_mib("VmHWM")

    def finish(self, rank: int, loss: float | None = None, extra: dict | None = None) -> None:
        record = {"rank": rank, "pid": os.getpid(), "peak_rss_mib": peak_rss_mib(),
                  "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_end_mib": _status_mib("VmRSS"), "rss_after_first_step_mib": self.rss_after_first_step,
                  "hwm_after_first_step_mib": self.hwm_after_first_step,
                  "rss_end_breakdown_mib": {field: _status_mib(field) for field in ("RssAnon", "RssFile", "RssShmem")},
                  "launch_to_first_step_s": (self.first_step_wall or time.time()) - self.t0,
                  "final_loss": loss, "steps_done": len(self.ends), "batch_size": self.batch_size,
                  **(extra or {})}
        if len(self.ends) > self.warmup:
            measured = self.ends[self.warmup - 1:] if self.warmup else self.ends
            record["measured_s"] = measured[-1] - measured[0]
            record["measured_steps"] = len(measured) - 1
            record["step_ms"] = [1e3 * (b - a) for a, b in zip(measured, measured[1:])]
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{rank}.json").write_text(json.dumps(record))


def throughput(record: dict, ranks: int) -> float:
    """Samples per second of the whole job, from rank 0's record (every rank trains the same batch size)."""
    return record["measured_steps"] * record["batch_size"] * ranks / record["measured_s"]


def _wait_for_the_gpu() -> None:
    """CUDA queues work ahead of the host, so a host clock read after `optimizer.step()` returns can
    precede the step's kernels. Synchronising at the two ends of the measured interval only (never
    in between) times the device's work without stopping any contender from queueing ahead."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def peak_rss_mib() -> float:
    """This process's own resident-set high-water mark (VmHWM).

    Not `getrusage().ru_maxrss` alone: Linux carries the *parent's* RSS at fork time into a
    spawned child's ru_maxrss (exec saves the old address space's high-water mark), so a worker
    started by a process that holds a model would be charged for its parent's memory. VmHWM
    belongs to the worker's own address space; ru_maxrss is still recorded next to it.
    """
    peak = _status_mib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_mib(field: str) -> float | None:
    """A memory field of /proc/self/status (Linux), in MiB."""
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return None



def fail(message: str) -> None:
    print(f"benchmark contender error: {message}", file=sys.stderr)
    sys.exit(1)
