"""Preemption notices: a signal that says "this job will be stopped soon" becomes one checkpoint at a
step boundary every rank agrees on, then a distinct exit (and, on SLURM, a requeue).

Schedulers warn before they take the machines away: SLURM sends SIGUSR1 (`--signal`) or SIGTERM before
a preemption or the time limit, Kubernetes and spot instances SIGTERM with a grace period, torch
elastic SIGTERM when it scales down. The notice may reach every rank, one rank, or only the
launching process (which forwards it to its workers). This module holds what a strategy is
configured with (`PreemptionPolicy`), what a fit holds (`PreemptionWatch`) and what every rank
raises at the end (`Preempted`); the pieces are `notice_signals` (catching the signal, the grace
deadline), `stop_agreement` (the step every rank stops after) and `slurm_requeue`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strategies.hang_guard import LEDGER
from strategies.notice_signals import EXIT_CODE, GraceDeadline, SignalFlag
from strategies.slurm_requeue import requeue_slurm_job, slurm_job_id
from strategies.stop_agreement import StopAgreement, reads_every

PREEMPTED_EXIT_CODE = EXIT_CODE  # sysexits' EX_TEMPFAIL: "try again later", which is what a requeue does
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")  # Kubernetes / elastic / SLURM's end; SLURM's --signal
REQUEUE_CHOICES = ("auto", True, False)
_UNCATCHABLE = ("SIGKILL", "SIGSTOP")
_KEY_PREFIX = "ddp_trainer/preemption"


def next_fit_key(restart_count: int) -> str:
    """A store key for one fit's agreement, the same on every rank and new for each fit (a fit after a
    preempted one must not read its stop step): every rank counts the fits of its current group."""
    return f"{_KEY_PREFIX}/restart-{restart_count}/fit-{LEDGER.next_fit()}"


@dataclass(frozen=True)
class PreemptionPolicy:
    """Which signals announce a preemption, how long the job has after one, and whether to requeue.

    `signals`: names such as "SIGTERM" (empty: preemption handling off; a signal then does what it
    did before). `grace_period_s`: seconds from the notice until this process gives up waiting for
    the checkpoint and exits (SLURM's default KillWait and Kubernetes' default grace are 30 s).
    `requeue`: "auto" requeues on SLURM (`SLURM_JOB_ID` set) with `scontrol requeue`; True or False.
    """

    signals: tuple[str, ...] = DEFAULT_SIGNALS
    grace_period_s: float = 25.0
    requeue: bool | str = "auto"

    def __post_init__(self) -> None:
        names = (self.signals,) if isinstance(self.signals, str) else tuple(self.signals)
        object.__setattr__(self, "signals", tuple(_signal_name(name) for name in names))
        grace = self.grace_period_s
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace > 0:
            raise ValueError(f"preemption grace_period_s must be a number of seconds > 0, got {grace!r}.")
        if self.requeue not in REQUEUE_CHOICES or isinstance(self.requeue, int) and not isinstance(self.requeue, bool):
            raise ValueError(f"preemption requeue={self.requeue!r} is not one of {REQUEUE_CHOICES}.")

    @classmethod
    def from_argument(cls, value: PreemptionPolicy | Mapping[str, Any] | bool | None) -> PreemptionPolicy:
        """A strategy's `preemption=` argument: a policy, its fields as a dict (the CLI's
        `strategy.preemption.*`), None/True for the defaults, or False to turn it off."""
        if isinstance(value, PreemptionPolicy):
            return value
        if value is None or value is True:
            return cls()
        if value is False:
            return cls(signals=())
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"signals", "grace_period_s", "requeue"})
            if unknown:
                raise ValueError(f"preemption has no setting {unknown[0]!r}; expected signals, grace_period_s "
                                 "or requeue.")
            return cls(**value)
        raise ValueError(f"preemption={value!r} must be a PreemptionPolicy, a dict of its settings, True or False.")

    @property
    def enabled(self) -> bool:
        return bool(self.signals)

    def should_requeue(self) -> bool:
        return self.requeue is True or (self.requeue == "auto" and slurm_job_id() is not None)


def _signal_name(name: Any) -> str:
    """'SIGTERM', 'TERM', 'sigusr1' or a number -> the canonical name; a clear error otherwise."""
    if isinstance(name, int) and not isinstance(name, bool):
        try:
            canonical = signal.Signals(name).name
        except ValueError:
            raise ValueError(f"preemption signal {name!r} is not a signal number of this platform.") from None
    else:
        text = str(name).upper()
        canonical = text if text.startswith("SIG") else f"SIG{text}"
    if canonical in _UNCATCHABLE:
        raise ValueError(f"preemption signal {canonical} cannot be caught; the scheduler's SIGKILL is what the "
                         "grace period runs ahead of. Use SIGTERM, SIGUSR1, ...")
    if canonical == "SIGINT":
        raise ValueError("preemption signal SIGINT is Ctrl-C, which stops the run at once (KeyboardInterrupt); "
                         "use SIGTERM or SIGUSR1.")
    if canonical not in signal.Signals.__members__:
        raise ValueError(f"preemption signal {name!r} is not a signal of this platform (e.g. 'SIGTERM', 'SIGUSR1').")
    return canonical


class Preempted(SystemExit):
    """Raised on every rank once the preemption checkpoint is written (or could not be): the
    process exits with PREEMPTED_EXIT_CODE unless caught. A SystemExit, as Lightning's
    SIGTERMException is, so a script ends without a traceback."""

    def __init__(self, step: int | None, signal_name: str, checkpoint_path: str | None, requeued: bool = False,
                 received_here: bool = False) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step, self.signal_name = step, signal_name
        self.checkpoint_path, self.requeued = checkpoint_path, requeued
        self.received_here = received_here  # this process got the notice itself (not only from a peer)

    def __reduce__(self) -> Any:  # pickled with a stage's result, e.g. by a test's script
        return (type(self), (self.step, self.signal_name, self.checkpoint_path, self.requeued, self.received_here))

    def __str__(self) -> str:
        saved = (f"checkpoint {self.checkpoint_path}" if self.checkpoint_path
                 else "no checkpoint written (the newest earlier checkpoint is the resume point)")
        requeue = "; the job was requeued" if self.requeued else ""
        where = f" after step {self.step}" if self.step is not None else ""
        return f"preempted by {self.signal_name}{where}: {saved}{requeue}"


class PreemptionWatch:
    """What one fit holds: the signal flag (installed while the fit runs), the agreement on the stop
    step, and the grace deadline that a notice (received, or learned from another rank) arms.

    `meet` is a barrier and `syncs` counts the synchronised backward passes so far: a step boundary
    reached without one since the previous is preceded by `meet()` on every rank, which the
    agreement's proof needs (strategies/stop_agreement.py). Use as a context manager."""

    def __init__(self, policy: PreemptionPolicy, store: Any, key: str, global_rank: int, world_size: int = 1,
                 meet: Callable[[], None] | None = None, syncs: Callable[[], int] | None = None) -> None:
        self.policy, self.global_rank = policy, global_rank
        self.deadline = GraceDeadline(policy.grace_period_s, policy.should_requeue(), global_rank)
        self.flag = SignalFlag(policy.signals, on_first=self.deadline.arm)
        self.agreement = StopAgreement(store, key, global_rank, reads_every(world_size))
        self._meet = meet or (lambda: None)
        self._syncs = syncs or (lambda: 0)
        self._syncs_seen = 0

    def __enter__(self) -> PreemptionWatch:
        self.flag.install()
        self._syncs_seen = self._syncs()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.flag.uninstall()
        self.deadline.disarm()

    def due(self, stepped: int) -> bool:
        """Whether every rank stops at this boundary, after `stepped` optimizer steps. Every rank
        calls it at every boundary where it could stop, in the same sequence."""
        if not self.policy.enabled:
            return False
        if self.agreement.store is not None:
            syncs = self._syncs()
            if syncs == self._syncs_seen:
                self._meet()  # no all-reduce since the last boundary: meet here instead
            self._syncs_seen = syncs
        due = self.agreement.due(stepped, self.flag.received)
        if self.agreement.stop_after is not None:
            self.deadline.arm()  # also on ranks that only learned of it: each must end in time
        return due

    @property
    def signal_name(self) -> str:
        return self.agreement.signal_name or self.flag.received or "a preemption signal"

    def stopped(self, step: int, checkpoint_path: str | None) -> Preempted:
        """The stop step is reached and the checkpoint written (or not: `checkpoint_path` None): requeue
        from rank 0 when due, stop the deadline, and return the exception every rank raises."""
        self.deadline.disarm()
        requeued = self.global_rank == 0 and self.policy.should_requeue() and requeue_slurm_job()
        return Preempted(step, self.signal_name, checkpoint_path, requeued, received_here=self.flag.received is not None)
