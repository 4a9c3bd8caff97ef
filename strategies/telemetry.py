"""Step telemetry of the gradient reducer: where a synchronised backward pass spends its time.

Per synchronised step the reducer records four instants and, per bucket, when its collective
was launched and when it completed:

    prepare_for_backward ── backward compute ──▶ end of backward ── exposed comm ──▶ grads averaged
                          └ bucket 0 [launch ─ done]  bucket 1 [launch ─ done] ... ┘

* backward: from `prepare_for_backward` to the end-of-backward callback (autograd finished).
* exposed communication: from the end of backward until every bucket is averaged: the part
  of communication nothing else hid.
* communication: the wall time during which at least one bucket was in flight (the union of
  the bucket intervals, so concurrent buckets are not counted twice).
* overlap = 1 - exposed / communication: the share of communication hidden behind backward.

Only host-side `time.perf_counter()` calls and `future.done()` polls (at each gradient hook,
at the end of backward and while waiting): no callback runs on a communication thread, no
device synchronisation and no collective, so it stays on by default. A completion is seen at
the next poll, which during backward is at most one parameter's gradient later. (On CUDA the
instants are host instants, i.e. when work was *issued*.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepTimes:
    """One synchronised step, in seconds."""

    backward_s: float = 0.0
    exposed_comm_s: float = 0.0
    comm_s: float = 0.0

    @property
    def overlap(self) -> float:
        """Fraction of communication hidden behind backward, in [0, 1] (1 when there was none)."""
        if self.comm_s <= 0.0:
            return 1.0
        return min(1.0, max(0.0, 1.0 - self.exposed_comm_s / self.comm_s))


@dataclass
class _Totals:
    steps: int = 0
    backward_s: float = 0.0
    exposed_comm_s: float = 0.0
    comm_s: float = 0.0


@dataclass
class ReducerTelemetry:
    """Timing of synchronised backward passes; `summary()` is what the strategy reports."""

    last: StepTimes = field(default_factory=StepTimes)
    totals: _Totals = field(default_factory=_Totals)
    _started: float | None = None  # None: no synchronised pass in progress
    _backward_end: float | None = None
    _intervals: list[list[float]] = field(default_factory=list)  # [launch, done] per bucket
    _pending: list[tuple[list[float], Any]] = field(default_factory=list)  # (interval, future) not seen done

    def begin_backward(self) -> None:
        self._started = time.perf_counter()
        self._backward_end = None
        self._intervals = []
        self._pending = []

    def grad_ready(self) -> None:
        """At every gradient hook: stamp finished buckets; the first hook of a pass starts the clock
        when `prepare_for_backward` (optional) did not."""
        if self._started is None:
            self.begin_backward()
        if self._pending:  # most hooks of a pass come before any bucket is launched: nothing to look at
            self.poll()

    def end_backward(self) -> None:
        if self._backward_end is None:
            self.poll()
            self._backward_end = time.perf_counter()

    def bucket_launched(self, future: Any) -> None:
        """Start timing one bucket whose result `future` will hold."""
        interval = [time.perf_counter(), 0.0]
        self._intervals.append(interval)
        self._pending.append((interval, future))

    def poll(self) -> None:
        """Stamp the buckets whose communication has completed since the last poll."""
        if not self._pending:
            return
        now = time.perf_counter()
        still = []
        for interval, future in self._pending:
            if future.done():
                interval[1] = now
            else:
                still.append((interval, future))
        self._pending = still

    def wait(self, future: Any) -> Any:
        """Wait for one bucket's result, stamping the buckets that finished meanwhile."""
        result = future.wait()
        self.poll()
        return result

    def end_step(self) -> StepTimes:
        """Close the step once every bucket is averaged; returns its times."""
        now = time.perf_counter()
        started = now if self._started is None else self._started
        backward_end = now if self._backward_end is None else self._backward_end  # None: finish_backward ended it
        step = StepTimes(backward_s=backward_end - started, exposed_comm_s=now - backward_end,
                         comm_s=union_length(self._intervals, now))
        self.last = step
        totals = self.totals
        totals.steps += 1
        totals.backward_s += step.backward_s
        totals.exposed_comm_s += step.exposed_comm_s
        totals.comm_s += step.comm_s
        self._started = None
        return step

    def summary(self) -> dict[str, Any]:
        """Last step and cumulative totals (a logger derives window averages from the totals)."""
        last, totals = self.last, self.totals
        overall = StepTimes(totals.backward_s, totals.exposed_comm_s, totals.comm_s)
        return {
            "synced_steps": totals.steps,
            "backward_s_last": last.backward_s,
            "exposed_comm_s_last": last.exposed_comm_s,
            "comm_s_last": last.comm_s,
            "overlap_last": last.overlap,
            "backward_s_total": totals.backward_s,
            "exposed_comm_s_total": totals.exposed_comm_s,
            "comm_s_total": totals.comm_s,
            "overlap_mean": overall.overlap,
        }


def union_length(intervals: Iterable[Sequence[float]], now: float = math.inf) -> float:
    """Total length covered by possibly overlapping [start, end] intervals, counted once where they
    overlap (an unfinished one, end 0, ends `now`)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted((start, end or now) for start, end in intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total
