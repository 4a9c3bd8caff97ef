"""What writing a checkpoint-sized file costs the processes computing beside it (#40).

Two processes keep every core busy with a one-thread compute loop (as two training ranks do), while this
process writes `--mb` megabytes every `--every` seconds, in one of several ways; the loops' iterations per
second against a run without writes are the price, and /proc/stat says where the CPU time went (this
process's system time, the kernel's I/O threads, a hypervisor's steal):

    python -m benchmarks.write_cost --out benchmarks/results/write_cost.json

* `direct`: `O_DIRECT` from a page-aligned buffer, then fsync (how strategies/direct_write.py writes).
* `buffered`: ordinary writes through the page cache, then fsync (how checkpoints were written before).
* `memcpy`: no file at all, one copy of the same bytes in memory (what a background save's snapshot costs).
* `none`: the loops alone. The kinds run in the order given, each for `--seconds`.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import tempfile
import time
from typing import Any

import torch

_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _compute_loop(results: Any, seconds: float) -> None:
    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a = torch.tanh(a @ a * 0.01)
        done += 1
    results.put(done / seconds)


def _cpu_ticks() -> dict[str, int]:
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:len(_STAT_FIELDS) + 1]]
    return dict(zip(_STAT_FIELDS, values))


def _write(kind: str, source: memoryview, copy: memoryview, path: str) -> None:
    if kind == "memcpy":
        copy[:] = source  # one copy of the bytes into memory already mapped, no file
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if kind == "direct" else 0)
    fd = os.open(path, flags)
    try:
        for offset in range(0, source.nbytes, 64 << 20):
            os.write(fd, source[offset:offset + (64 << 20)])
        os.fsync(fd)
    finally:
        os.close(fd)


def measure(kind: str, megabytes: int, every: float, seconds: float, directory: str) -> dict[str, Any]:
    buffer = mmap.mmap(-1, megabytes << 20)  # page-aligned, as O_DIRECT needs
    source = memoryview(buffer)
    source[:] = os.urandom(1 << 20) * megabytes
    copy = memoryview(bytearray(source)) if kind == "memcpy" else source  # (touched now, not while counted)
    results: Any = mp.get_context("spawn").Queue()
    loops = [mp.get_context("spawn").Process(target=_compute_loop, args=(results, seconds)) for _ in range(2)]
    for loop in loops:
        loop.start()
    time.sleep(2.0)  # the loops' start (spawn, import torch) is outside the counted window
    before, start, writes = _cpu_ticks(), time.perf_counter(), 0
    while kind != "none" and time.perf_counter() - start < seconds - 4.0:
        _write(kind, source, copy, os.path.join(directory, "write_cost.bin"))
        writes += 1
        time.sleep(max(0.0, every * writes - (time.perf_counter() - start)))
    time.sleep(max(0.0, seconds - 4.0 - (time.perf_counter() - start)))
    after = _cpu_ticks()
    for loop in loops:
        loop.join()
    rates = [results.get() for _ in loops]
    ticks = {field: after[field] - before[field] for field in _STAT_FIELDS}
    return {"kind": kind, "writes": writes, "loop_iterations_per_s": sum(rates), "cpu_ticks": ticks}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default="none,direct,buffered,memcpy,none,direct,buffered,memcpy")
    parser.add_argument("--mb", type=int, default=507, help="bytes per write, in MiB (a 44M-parameter Adam checkpoint)")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between writes")
    parser.add_argument("--seconds", type=float, default=20.0, help="per kind")
    parser.add_argument("--dir", default=".", help="where the file is written (the checkpoints' disk)")
    parser.add_argument("--out", default="benchmarks/results/write_cost.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        runs = [measure(kind, args.mb, args.every, args.seconds, directory) for kind in args.kinds.split(",")]
    idle = [run["loop_iterations_per_s"] for run in runs if run["kind"] == "none"]
    baseline = sorted(idle)[len(idle) // 2] if idle else None
    for run in runs:
        run["over_none"] = run["loop_iterations_per_s"] / baseline if baseline else None
        ticks = run["cpu_ticks"]
        print(f"{run['kind']:9s} writes {run['writes']:2d}  loops {run['loop_iterations_per_s']:7.1f} it/s "
              f"({run['over_none']:.3f} of none)  ticks: " + " ".join(f"{k} {v}" for k, v in ticks.items()))
    with open(args.out, "w") as out:
        json.dump({"settings": vars(args), "clock_ticks_per_s": os.sysconf("SC_CLK_TCK"), "runs": runs}, out,
                  indent=1)


if __name__ == "__main__":
    main()
