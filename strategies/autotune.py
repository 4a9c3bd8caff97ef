"""`bucket_cap_mb="auto"`: try a few bucket sizes during the first steps and keep the fastest.

Why measure instead of guessing: the best size depends on how communication competes with
compute. With NCCL on a GPU, small buckets hide communication behind backward; with gloo on a
CPU whose cores are all busy computing, the all-reduce is itself CPU work, so overlapping it
mostly time-slices the same cores and one large bucket can win. Only a measurement knows.

The tuning lives here, not in the reducer: the reducer only plans buckets and offers
`replan(cap)` between passes and an `after_sync` callback with each pass's times. `CapTuning`
plugs into that callback; the strategy (ours or the Lightning plug-in) attaches it and carries
its pick into checkpoints.

The schedule is a pure state machine (unit-tested without a process group): each candidate
plan gets `settle_steps` unmeasured steps (new buffers, caches) and then `measure_steps` timed
ones; the metric is the reducer's synchronised step time (backward + exposed communication),
the only part of a step the bucket size changes. Candidates whose plans are identical for this
model are tried once. The decision needs every rank to agree, so `agree()` takes the slowest
rank's time per candidate (one all-reduce of a few floats) and rank 0's pick is broadcast:
both are collectives every rank issues at the same synchronised step.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from strategies.hang_guard import LEDGER
from strategies.telemetry import StepTimes

if TYPE_CHECKING:  # the reducer is imported where one is built; this module stays light for the launcher
    from strategies.reducer import GradReducer

AUTO = "auto"
DEFAULT_CANDIDATES_MB: tuple[float, ...] = (1.0, 4.0, 25.0, 100.0)
FIRST_PASS_CAP_MB = 25.0  # "auto": the plan of the first pass, which only observes the readiness order
_log = logging.getLogger(__name__)


@dataclass
class BucketAutotuner:
    """Which bucket cap to use for the next synchronised step, and what was measured so far."""

    candidates_mb: list[float]
    settle_steps: int = 1
    measure_steps: int = 3
    samples: dict[float, list[float]] = field(default_factory=dict)
    chosen_mb: float | None = None
    agreed_ms: list[float] | None = None  # slowest rank's median per candidate, once agreed
    _position: int = 0  # index into candidates_mb
    _step_in_candidate: int = 0

    def __post_init__(self) -> None:
        if not self.candidates_mb:
            raise ValueError("BucketAutotuner needs at least one candidate bucket size.")
        if self.settle_steps < 0 or self.measure_steps < 1:
            raise ValueError(f"settle_steps must be >= 0 and measure_steps >= 1; got {self.settle_steps} and "
                             f"{self.measure_steps}.")
        if len(self.candidates_mb) == 1:
            self.chosen_mb = self.candidates_mb[0]

    @property
    def done(self) -> bool:
        return self.chosen_mb is not None

    @property
    def current_mb(self) -> float:
        """The cap to plan buckets with now (the chosen one once done)."""
        if self.chosen_mb is not None:
            return self.chosen_mb
        return self.candidates_mb[self._position]

    @property
    def steps_needed(self) -> int:
        return len(self.candidates_mb) * (self.settle_steps + self.measure_steps)

    def record(self, step_s: float) -> bool:
        """Feed one synchronised step's time; True when the next step should use another cap
        (or, when every candidate has its samples, that `agree()` must run now)."""
        if self.done:
            return False
        self._step_in_candidate += 1
        if self._step_in_candidate > self.settle_steps:
            self.samples.setdefault(self.current_mb, []).append(step_s)
        if self._step_in_candidate < self.settle_steps + self.measure_steps:
            return False
        self._step_in_candidate = 0
        self._position = min(self._position + 1, len(self.candidates_mb) - 1)
        return True

    @property
    def measured_all(self) -> bool:
        return all(len(self.samples.get(mb, [])) >= self.measure_steps for mb in self.candidates_mb)

    def local_medians(self) -> list[float]:
        return [statistics.median(self.samples[mb]) for mb in self.candidates_mb]

    def agree(self, group: dist.ProcessGroup | None, world_size: int) -> float:
        """Pick the candidate whose slowest rank was fastest; identical on every rank."""
        times = torch.tensor(self.local_medians(), dtype=torch.float64)
        choice = torch.zeros(1, dtype=torch.int64)
        if world_size > 1:
            LEDGER.begin("all_reduce(bucket autotune timings)", times)
            dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
        choice[0] = int(torch.argmin(times).item())
        if world_size > 1:
            src = 0 if group is None else dist.get_global_rank(group, 0)
            LEDGER.begin("broadcast(bucket autotune choice)", choice)
            dist.broadcast(choice, src=src, group=group)
        self.agreed_ms = [value * 1e3 for value in times.tolist()]
        self.chosen_mb = self.candidates_mb[int(choice.item())]
        return self.chosen_mb

    def narrow(self, candidates_mb: list[float]) -> None:
        """Keep only these candidates (those with distinct plans); before any measurement."""
        if self.samples or not candidates_mb:
            raise RuntimeError("narrow() needs a non-empty list and must come before the first record().")
        self.candidates_mb = list(candidates_mb)
        if len(self.candidates_mb) == 1:
            self.chosen_mb = self.candidates_mb[0]

    def summary(self) -> dict[str, Any]:
        return {
            "candidates_mb": list(self.candidates_mb),
            "step_ms": self.agreed_ms,
            "chosen_mb": self.chosen_mb,
            "done": self.done,
        }


def distinct_candidates(plans: dict[float, list[list[int]]]) -> list[float]:
    """Candidates whose bucket plans differ (the smallest cap of each identical group), in order."""
    seen: list[list[list[int]]] = []
    kept: list[float] = []
    for cap in sorted(plans):
        if plans[cap] not in seen:
            seen.append(plans[cap])
            kept.append(cap)
    return kept


def autotuner_for(bucket_cap_mb: float | str, candidates_mb: Sequence[float] | None,
                  measure_steps: int) -> BucketAutotuner | None:
    """A tuner for `bucket_cap_mb="auto"`, None for a number (which the planner validates)."""
    if isinstance(bucket_cap_mb, str) and bucket_cap_mb != AUTO:
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} must be a positive number of MiB or {AUTO!r}.")
    if candidates_mb is not None and (not candidates_mb or not all(float(mb) > 0 for mb in candidates_mb)):
        raise ValueError(f"autotune_candidates_mb={list(candidates_mb)!r} must be positive MiB values.")
    if isinstance(measure_steps, bool) or not isinstance(measure_steps, int) or measure_steps < 1:
        raise ValueError(f"autotune_measure_steps={measure_steps!r} must be an int >= 1.")
    if bucket_cap_mb != AUTO:
        return None
    return BucketAutotuner([float(mb) for mb in candidates_mb or DEFAULT_CANDIDATES_MB], measure_steps=measure_steps)


def first_pass_cap_mb(bucket_cap_mb: float | str) -> float:
    """The cap a reducer is built with: the number given, or for "auto" the first pass's plan
    (that pass only observes the readiness order the candidates are then planned in)."""
    return FIRST_PASS_CAP_MB if bucket_cap_mb == AUTO else float(bucket_cap_mb)


class CapTuning:
    """`bucket_cap_mb="auto"` for one reducer: after every synchronised pass (the reducer's
    `after_sync`, so on every rank at the same pass) it feeds the pass's time to the tuner and
    re-plans the reducer when the tuner moves on to another candidate or has agreed on one."""

    def __init__(self, reducer: GradReducer, tuner: BucketAutotuner) -> None:
        self.tuner = tuner
        self._reducer = reducer
        self._ordered = False  # True once the first pass (the reducer's rebuild) is behind us
        reducer.after_sync = self.after_sync

    @classmethod
    def attach(cls, reducer: GradReducer, bucket_cap_mb: float | str, candidates_mb: Sequence[float] | None = None,
               measure_steps: int = 3, adopted_mb: float | None = None) -> CapTuning | None:
        """Tune `reducer` when `bucket_cap_mb` is "auto" (None for a number); before its first pass.
        `adopted_mb` is a cap chosen earlier (a checkpoint's), used instead of measuring."""
        tuner = autotuner_for(bucket_cap_mb, candidates_mb, measure_steps)
        if tuner is None:
            return None
        tuning = cls(reducer, tuner)
        if adopted_mb is not None:
            tuning.adopt(adopted_mb)
        return tuning

    @property
    def chosen_mb(self) -> float | None:
        return self.tuner.chosen_mb

    def adopt(self, bucket_cap_mb: float) -> None:
        """Use a cap chosen earlier (a checkpoint's) instead of measuring; between steps, on every rank."""
        self._reducer.replan(float(bucket_cap_mb))  # validates it first
        self.tuner = BucketAutotuner([float(bucket_cap_mb)])

    def after_sync(self, step: StepTimes) -> None:
        """The reducer's end-of-pass callback: start trying candidates, or record and move on."""
        if not self._ordered:
            self._ordered = True
            self._try_distinct_plans()
        elif not self.tuner.done and self.tuner.record(step.backward_s + step.exposed_comm_s):
            self._next_candidate()

    def summary(self) -> dict[str, Any]:
        return self.tuner.summary()

    def _try_distinct_plans(self) -> None:
        """The reducer has just rebuilt in the observed order: keep the candidates whose plans differ."""
        if not self.tuner.done:
            plans = {mb: self._reducer.plan_for(mb) for mb in self.tuner.candidates_mb}
            self.tuner.narrow(distinct_candidates(plans))
        self._reducer.replan(self.tuner.current_mb)

    def _next_candidate(self) -> None:
        tuner = self.tuner
        if tuner.measured_all:
            chosen = tuner.agree(self._reducer.process_group, self._reducer.world_size)
            _log.info("bucket_cap_mb='auto' chose %s MiB (slowest-rank step ms per candidate %s: %s)",
                      chosen, tuner.candidates_mb, tuner.agreed_ms)
        self._reducer.replan(tuner.current_mb)


def reducer_summary(reducer: GradReducer, tuning: CapTuning | None) -> dict[str, Any]:
    """The reducer's summary with what "auto" measured under "autotune" (None for a fixed cap),
    where the telemetry callback and the benchmarks read it."""
    return {**reducer.summary(), "autotune": tuning.summary() if tuning is not None else None}
