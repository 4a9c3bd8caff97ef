"""`Trainer(profiler=...)` and `trainer.profiler`: where a stage's wall time goes, by action.

Lightning's meaning: without a profiler, `trainer.profiler` still exists and
`with self.trainer.profiler.profile("name"):` in user code costs nothing (a pass-through).
`profiler="simple"` times every action: each hook of the module, datamodule and callbacks (named
`[LightningModule]Class.hook`, `[Callback]state_key.hook`, ...), the strategy's steps and backward,
fetching the next batch, whole training batches and epochs, checkpoint saves, and whatever the
user profiles. When a stage ends, the report (per action: mean, calls, total, share of the stage)
is printed by local rank 0, or with `filename=` written by every rank to
`dirpath/{stage}-{filename}[-rank].txt` (dirpath defaults to the Trainer's log directory).

A Lightning profiler instance (anything with `profile`, `describe`) is driven through the same
calls Lightning makes: `setup(stage, local_rank, log_dir)`, `profile(action)`, `describe()`,
`teardown(stage)`. Timings are host instants (`perf_counter`): work queued on a GPU is attributed
to whichever action waits for it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

PROFILER_NAMES = ("simple",)
_NOTHING = contextlib.nullcontext()  # reusable: entering it does nothing


class PassThroughProfiler:
    """No profiler: every action runs untimed."""

    enabled = False

    def profile(self, action_name: str) -> contextlib.AbstractContextManager[None]:
        return _NOTHING

    def start(self, action_name: str) -> None: ...

    def stop(self, action_name: str) -> None: ...

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None: ...

    def describe(self) -> None: ...

    def summary(self) -> str:
        return ""

    def teardown(self, stage: str | None = None) -> None: ...


class SimpleProfiler(PassThroughProfiler):
    """Wall time per action; `summary()` is the table, sorted by total time."""

    enabled = True

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None) -> None:
        self.dirpath = None if dirpath is None else os.fspath(dirpath)
        self.filename = filename
        self._durations: dict[str, list[float]] = defaultdict(list)
        self._started: dict[str, float] = {}
        self._stage: str | None = None
        self._local_rank: int | None = None
        self._stage_started = time.perf_counter()

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[None]:
        self.start(action_name)
        try:
            yield
        finally:
            self.stop(action_name)

    def start(self, action_name: str) -> None:
        if action_name in self._started:
            raise ValueError(f"profiler action {action_name!r} was started twice without stop() in between.")
        self._started[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        started = self._started.pop(action_name, None)
        if started is None:
            raise ValueError(f"profiler action {action_name!r} was stopped without start().")
        self._durations[action_name].append(time.perf_counter() - started)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        self._stage, self._local_rank = stage, local_rank
        self.dirpath = self.dirpath or log_dir
        self._durations.clear()
        self._started.clear()
        self._stage_started = time.perf_counter()

    def summary(self) -> str:
        stage_total = max(time.perf_counter() - self._stage_started, 1e-12)
        rows = sorted(((name, sum(times), len(times)) for name, times in self._durations.items()),
                      key=lambda row: row[1], reverse=True)
        width = max([len("Action"), *(len(name) for name, _, _ in rows)])
        title = f"Profiler report: {self._stage or 'stage'}" + (
            f", local rank {self._local_rank}" if self._local_rank else "")
        lines = [title, f"{'Action':<{width}} | {'Mean (s)':>10} | {'Calls':>7} | {'Total (s)':>10} | {'% of stage':>10}",
                 "-" * (width + 49),
                 f"{'Total':<{width}} | {'-':>10} | {'-':>7} | {stage_total:>10.5f} | {100.0:>10.1f}"]
        lines += [f"{name:<{width}} | {total / calls:>10.5f} | {calls:>7} | {total:>10.5f} | "
                  f"{100.0 * total / stage_total:>10.1f}" for name, total, calls in rows]
        return "\n".join(lines)

    def describe(self) -> None:
        """The report: printed by local rank 0 (Lightning's rule), or written to a file by every rank when
        `filename` is set."""
        if self.filename:
            directory = self.dirpath or "."
            os.makedirs(directory, exist_ok=True)
            suffix = f"-{self._local_rank}" if self._local_rank else ""
            path = os.path.join(directory, f"{self._stage or 'stage'}-{self.filename}{suffix}.txt")
            with open(path, "a", encoding="utf-8") as report:
                report.write(self.summary() + "\n")
        elif not self._local_rank:
            print(self.summary(), flush=True)


def resolve_profiler(profiler: Any) -> Any:
    """The Trainer's `profiler` argument as a profiler object: None -> the pass-through, "simple" -> ours,
    a profiler instance (ours or Lightning's) as it is."""
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, str):
        if profiler.lower() == "simple":
            return SimpleProfiler()
        raise ValueError(f"profiler={profiler!r} is not available: use one of {list(PROFILER_NAMES)}, a profiler "
                         "instance (Lightning's SimpleProfiler/AdvancedProfiler/PyTorchProfiler work), or None.")
    if not (callable(getattr(profiler, "profile", None)) and callable(getattr(profiler, "describe", None))):
        raise TypeError(f"profiler={type(profiler).__name__} is not a profiler: it needs profile(action_name) and "
                        "describe() methods (pass 'simple' or a Lightning profiler instance).")
    return profiler


def is_profiling(profiler: Any) -> bool:
    """Whether actions are worth timing: our pass-through says no, so the training step skips even naming
    them (the epoch and batch actions enter a shared no-op context)."""
    return bool(getattr(profiler, "enabled", True))


def profile_strategy(trainer: Any, hook: str) -> contextlib.AbstractContextManager[None]:
    """Time the strategy's `hook` (its steps, backward) as `[Strategy]Class.hook`, Lightning's name; with
    no profiler, nothing is named or entered on the step's hot path."""
    profiler = trainer.profiler
    if not is_profiling(profiler):
        return _NOTHING
    return profiler.profile(f"[Strategy]{type(trainer.strategy).__name__}.{hook}")
