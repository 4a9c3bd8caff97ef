"""Python function calls per training step, by where they run: the host work of a step, counted.

On a GPU a step's host work (Python, and the ops it launches) is what holds a launch-bound model back; on a
shared CPU its time cannot be measured to a few percent (#37: load 4-15 on 2 cores), but the calls it makes
can be counted exactly, and they are the same on every machine. `benchmarks/op_count.py` counts the ops a
step launches; this counts the Python calls around them, charged to the module that defines each function
("strategies/reducer.py", "trainer/loops/training_step.py", "torch:optim", ...). cProfile's own overhead
inflates times, so only the counts are reported.

    python -m benchmarks.step_overhead --model gpt_host --gpu-settings --foreach --torch-ddp --count-calls 50
"""

from __future__ import annotations

import cProfile
import pstats
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

_PROJECT = str(Path(__file__).resolve().parents[1]) + "/"


def room_of(filename: str) -> str:
    """Our files by path ("strategies/reducer.py"), torch's by subpackage ("torch:optim"), builtins as "C"."""
    if filename.startswith(_PROJECT) and "site-packages" not in filename:
        return filename[len(_PROJECT):]
    if "/torch/" in filename:
        return "torch:" + filename.split("/torch/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if filename == "~":
        return "C (builtins and methods)"
    return "other Python"


class CallWindow:
    """A profiler on for exactly `steps` whole steps from step `start` (as op_count.CountWindow)."""

    def __init__(self, start: int, steps: int) -> None:
        self.profiler, self.start, self.steps = cProfile.Profile(), start, steps
        self._on = False

    def at_step(self, batch_idx: int) -> None:
        should = self.start <= batch_idx < self.start + self.steps
        if should != self._on:
            (self.profiler.enable if should else self.profiler.disable)()
            self._on = should

    def close(self) -> None:
        if self._on:
            self.profiler.disable()
            self._on = False

    def calls_per_room(self) -> Counter[str]:
        """Calls per step, by room."""
        counts: Counter[str] = Counter()
        stats = pstats.Stats(self.profiler).stats  # type: ignore[attr-defined]
        for (filename, _line, _name), (_primitive, calls, _tottime, _cumtime, _callers) in stats.items():
            counts[room_of(filename)] += calls / self.steps
        return counts


def format_calls(results: dict[str, Counter[str]], top: int = 14) -> Iterable[str]:
    """One column per contender, rooms with the most calls first, then the total."""
    names = list(results)
    rooms = sorted(set().union(*results.values()), key=lambda room: -max(r[room] for r in results.values()))
    yield f"{'calls per step':>40} " + " ".join(f"{name:>16}" for name in names)
    for room in rooms[:top]:
        yield f"{room:>40} " + " ".join(f"{results[name][room]:16.1f}" for name in names)
    yield f"{'total':>40} " + " ".join(f"{sum(results[name].values()):16.1f}" for name in names)
