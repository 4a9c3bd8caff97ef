"""Count, per training step, the ops a GPU would launch, and where in the code each comes from (#30).

A CPU cannot show what a kernel launch costs a host-bound GPU step, but it can count the launches:
every aten op that reaches the backend is one kernel (or copy) on CUDA, except views, `detach`
and allocations, which only touch metadata. `OpCounter` is a `TorchDispatchMode` that counts those
ops while a step window is open, and charges each to its source: the innermost Python frame that
one of `SOURCES` recognises (the reducer's gradient hook, the non-finite check, the optimizer, the
Trainer's bookkeeping, the model's forward, autograd's backward). Work without a Python frame of
its own, such as torch DDP's C++ reducer copying gradients into its buckets, shows up under the
frame that started it ("backward"), by op name.

Counts are approximate in the way launch counts are: a foreach op is one entry here and a few
chunked launches on CUDA; a fused CUDA kernel may replace several CPU ops. The comparison between
loops doing the same arithmetic is what they are for.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterable
from types import FrameType
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

# Ops that allocate, alias or annotate without launching a kernel (views are recognised from their schema).
NO_LAUNCH = frozenset({"detach", "alias", "lift_fresh", "_unsafe_view", "empty", "empty_like", "empty_strided",
                       "new_empty", "new_empty_strided", "set_", "resize_", "promote_types",
                       "_record_function_enter", "_record_function_enter_new", "_record_function_exit"})
HOST_ONLY = "data loading (host-side collate)"

# (path fragment, function name or None for any, label): the innermost frame matching one names the source.
SOURCES: tuple[tuple[str, str | None, str], ...] = (
    ("strategies/reducer.py", "_absorb_grad", "reducer: gradient copied into its bucket"),
    ("strategies/buckets.py", "copy_in", "reducer: gradient copied into its bucket"),  # one foreach copy per bucket
    ("strategies/buckets.py", "copy_one", "reducer: gradient copied into its bucket"),  # one gradient (a CPU)
    ("strategies/", None, "reducer/strategy: other"),
    ("trainer/nonfinite.py", None, "non-finite check"),
    ("torch/optim/", None, "optimizer step"),
    ("torch/utils/data/", None, HOST_ONLY),
    ("trainer/", None, "trainer: {module}"),
    ("torch/nn/parallel/", None, "torch DDP wrapper"),
    ("torch/nn/modules/", None, "forward + loss"),
    ("torch/nn/functional.py", None, "forward + loss"),
    ("benchmarks/workloads.py", None, "forward + loss"),
    ("torch/autograd/", None, "backward"),
    ("torch/_tensor.py", "backward", "backward"),
)


def launches_kernel(func: Any) -> bool:
    """Whether this aten op would be a kernel (or copy) launch on CUDA."""
    return not func.is_view and func._overloadpacket.__name__ not in NO_LAUNCH


def source_of(frame: FrameType | None) -> str:
    """The label of the innermost frame a rule of `SOURCES` recognises; else that of the innermost frame
    outside torch, as `path:function`."""
    fallback = None
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        for fragment, function, label in SOURCES:
            if fragment in path and function in (None, frame.f_code.co_name):
                return label.format(module=path.rsplit("/", 1)[-1].removesuffix(".py"))
        if fallback is None and "/torch/" not in path:
            fallback = f"{path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return fallback or "unknown"


class OpCounter(TorchDispatchMode):
    """Counts (source, op) pairs of kernel-launching ops while `active`; enter it around the whole run
    and open the window with `active` (a step hook does), so set-up and warm-up count for nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.counts: Counter[tuple[str, str]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.active and launches_kernel(func):
            self.counts[(source_of(sys._getframe(1)), func._overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


class CountWindow:
    """Opens the counter at step `start` and closes it at step `start + steps`: exactly `steps` whole
    steps, from one step's start to the next's, so work between steps (hooks, the next batch) counts."""

    def __init__(self, counter: OpCounter, start: int, steps: int) -> None:
        self.counter, self.start, self.steps = counter, start, steps

    def at_step(self, batch_idx: int) -> None:
        self.counter.active = self.start <= batch_idx < self.start + self.steps

    def close(self) -> None:
        self.counter.active = False


def per_step(counts: Counter[tuple[str, str]], steps: int) -> dict[str, dict[str, float]]:
    """{source: {op: launches per step}}, sources by launches, descending."""
    table: dict[str, dict[str, float]] = {}
    for (source, op), count in sorted(counts.items(), key=lambda item: -item[1]):
        table.setdefault(source, {})[op] = count / steps
    return dict(sorted(table.items(), key=lambda item: -sum(item[1].values())))


def device_total(table: dict[str, dict[str, float]]) -> float:
    """Launches per step a GPU would see: everything but the host-side collate of the data loader."""
    return sum(sum(ops.values()) for source, ops in table.items() if source != HOST_ONLY)


def format_counts(results: dict[str, dict[str, dict[str, float]]], top_ops: int = 4) -> Iterable[str]:
    """Lines of a readable report: each contender's total, then its sources with their commonest ops."""
    for name, table in results.items():
        yield f"{name}: {device_total(table):.1f} launches/step (host-side collate excluded)"
        for source, ops in table.items():
            common = ", ".join(f"{op} {count:g}" for op, count in list(ops.items())[:top_ops])
            more = f", +{len(ops) - top_ops} more ops" if len(ops) > top_ops else ""
            yield f"    {sum(ops.values()):7.1f}  {source}  ({common}{more})"
