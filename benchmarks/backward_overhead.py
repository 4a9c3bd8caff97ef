"""What a DDP engine adds to one backward pass: our GradReducer against torch's DistributedDataParallel (#18).

Our reducer runs a Python hook per parameter (copy the gradient into its bucket slot, count the
bucket down, launch it when complete); torch DDP does the same in C++. On a GPU with a compiled model
this per-parameter host work is what could hold a step back, so it is measured alone here: one process
(a gloo group of one, so the all-reduce itself costs almost nothing), a stack of small Linear layers
(many parameter tensors, little arithmetic), 1 thread, gradients set to None before each step as
`optimizer.zero_grad()` does. Each figure is the median backward time (forward excluded) over the steps
after a warm-up; the three variants alternate for several rounds and the medians of the rounds are reported.

    python -m benchmarks.backward_overhead                  # 38 layers: 76 parameter tensors
    python -m benchmarks.backward_overhead --layers 100 --width 16
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.step_overhead import one_process_group
from strategies.reducer import GradReducer


def _model(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def backward_us(model: nn.Module, reducer: GradReducer | None, batch: torch.Tensor, steps: int, warmup: int) -> float:
    """Median microseconds of `loss.backward()` (with the reducer's calls around it when given)."""
    times = []
    for _ in range(steps):
        for param in model.parameters():
            param.grad = None
        loss = model(batch).sum()
        started = time.perf_counter()
        if reducer is not None:
            reducer.prepare_for_backward(loss)
        loss.backward()
        if reducer is not None:
            reducer.finish_backward()
        times.append(time.perf_counter() - started)
    return statistics.median(times[warmup:]) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=38)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with one_process_group():
        batch = torch.randn(4, args.width)
        plain, ours, theirs = (_model(args.layers, args.width) for _ in range(3))
        reducer = GradReducer(ours)
        torch_ddp = nn.parallel.DistributedDataParallel(theirs)
        runs: dict[str, Callable[[], float]] = {
            "no DDP": lambda: backward_us(plain, None, batch, args.steps, args.warmup),
            "ours (GradReducer)": lambda: backward_us(ours, reducer, batch, args.steps, args.warmup),
            "torch DDP": lambda: backward_us(torch_ddp, None, batch, args.steps, args.warmup),
        }
        results: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                results[name].append(run())
    base = statistics.median(results["no DDP"])
    tensors = sum(1 for _ in plain.parameters())
    print(f"{tensors} parameter tensors, {args.rounds} rounds of {args.steps} steps; median backward:")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:>20}: {median:8.1f} us  (+{median - base:6.1f} us, {(median - base) / tensors:5.2f} us per tensor)")


if __name__ == "__main__":
    main()
