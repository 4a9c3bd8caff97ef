"""Preemption notices: a signal that says "this job will be stopped soon" becomes one checkpoint at a
step boundary every rank agrees on, then a distinct exit (and, on SLURM, a requeue).

Schedulers warn before they take the machines away: SLURM sends SIGUSR1 (`--signal`) or SIGTERM before
a preemption or the time limit, Kubernetes and spot instances SIGTERM with a grace period, torch
elastic SIGTERM when it scales down. The notice may reach every rank, one rank, or only the
launching process (which forwards it to its workers). Three pieces turn it into a checkpoint:

* `SignalFlag` (per process): the handler only records the signal; the training loop acts on it
  at its next step boundary, where no collective is half-issued.
* `StopAgreement` (per fit): ranks learn of the notice at different moments, yet must all stop
  after the same optimizer step. A rank that holds a notice at step boundary `c` publishes
  "stop after step c+1" in the rendezvous store (first writer wins); every rank reads that key at
  each boundary. No rank can have passed boundary c+1 when the key is written, since step c+1's
  gradient all-reduce needs the writer's contribution, which comes after the write. So every
  rank sees the same stop step before it reaches it.
* `GraceDeadline`: if the agreed checkpoint cannot be written in time (a rank stuck in its own
  code), the process requeues (rank 0 on SLURM) and exits with the preemption code before the
  scheduler's SIGKILL, leaving the previous checkpoint as the resume point.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PREEMPTED_EXIT_CODE = 75  # sysexits' EX_TEMPFAIL: "try again later", which is what a requeue does
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")  # Kubernetes / elastic / SLURM's end; SLURM's --signal
REQUEUE_CHOICES = ("auto", True, False)
_UNCATCHABLE = ("SIGKILL", "SIGSTOP")
_KEY_PREFIX = "ddp_trainer/preemption"
_FITS_IN_THIS_PROCESS = itertools.count(1)  # every rank counts its fits alike


def next_fit_key(restart_count: int) -> str:
    """A store key for one fit's agreement, the same on every rank and new for each fit (a fit after a
    preempted one must not read its stop step)."""
    return f"{_KEY_PREFIX}/restart-{restart_count}/fit-{next(_FITS_IN_THIS_PROCESS)}"


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

    def signal_numbers(self) -> list[signal.Signals]:
        return [signal.Signals[name] for name in self.signals]

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

    def __init__(self, step: int | None, signal_name: str, checkpoint_path: str | None, requeued: bool = False) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step, self.signal_name = step, signal_name
        self.checkpoint_path, self.requeued = checkpoint_path, requeued

    def __reduce__(self) -> Any:  # travels from a worker to the launching process
        return (type(self), (self.step, self.signal_name, self.checkpoint_path, self.requeued))

    def __str__(self) -> str:
        saved = (f"checkpoint {self.checkpoint_path}" if self.checkpoint_path
                 else "no checkpoint written (the newest earlier checkpoint is the resume point)")
        requeue = "; the job was requeued" if self.requeued else ""
        where = f" after step {self.step}" if self.step is not None else ""
        return f"preempted by {self.signal_name}{where}: {saved}{requeue}"


_HELD_NOTICES: list[str] = []  # notices a worker received before its fit's watch was installed


def hold_notices(signals: tuple[str, ...]) -> Any:
    """In a worker, from the moment a stage arrives: record notices instead of dying of them, so one
    forwarded while the stage sets up is not lost (the fit's `SignalFlag` takes it over). Returns
    the function that puts the previous handlers back and forgets what was held."""
    if not signals or threading.current_thread() is not threading.main_thread():
        return lambda: None
    _HELD_NOTICES.clear()
    previous = {number: signal.signal(number, _hold) for number in (signal.Signals[name] for name in signals)}

    def release() -> None:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        _HELD_NOTICES.clear()

    return release


def _hold(signum: int, frame: Any) -> None:
    _HELD_NOTICES.append(signal.Signals(signum).name)


class SignalFlag:
    """Records the first preemption signal this process receives, between `install` and `uninstall`.

    The handler only sets fields (no I/O, no collective): the loop acts at its next step boundary.
    Handlers can be set from the main thread only; elsewhere (a fit run in a thread) nothing is
    installed and a notice cannot be caught, which `installed` tells.
    """

    def __init__(self, policy: PreemptionPolicy) -> None:
        self.policy = policy
        self.received: str | None = None
        self.received_at: float | None = None
        self.installed = False
        self._previous: dict[signal.Signals, Any] = {}
        self.on_first_signal: Any = None  # called once, from the handler (arms the grace deadline)

    def install(self) -> SignalFlag:
        if not self.policy.enabled or threading.current_thread() is not threading.main_thread():
            return self
        for number in self.policy.signal_numbers():
            self._previous[number] = signal.signal(number, self._handle)
        self.installed = True
        held = [name for name in _HELD_NOTICES if name in self.policy.signals]
        if held:  # it came while this worker was still setting up the stage
            self._record(held[0])
        return self

    def uninstall(self) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self.installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        self._record(signal.Signals(signum).name)

    def _record(self, name: str) -> None:
        if self.received is not None:
            return
        self.received, self.received_at = name, time.monotonic()
        print(f"[rank {os.environ.get('RANK', '0')}] {self.received} received: checkpointing at the next step "
              "boundary, then exiting (preemption).", file=sys.stderr, flush=True)
        if self.on_first_signal is not None:
            self.on_first_signal()


@dataclass
class StopAgreement:
    """Which step every rank stops after; see the module docstring for why it is safe.

    `store` is the process group's rendezvous store (None for one process: the local flag is the
    decision). `key` must be the same on every rank and new for each fit. `every`: ranks read the
    key only after every `every`-th step, and a notice names the next such step (still at least
    c+1): so one store serves a large job (`reads_every`) at the price of a few steps' delay.
    """

    flag: SignalFlag
    store: Any = None
    key: str = f"{_KEY_PREFIX}/stop_after"
    every: int = 1
    stop_after: int | None = None
    signal_name: str | None = None
    _published: bool = field(default=False, repr=False)

    def due(self, stepped: int) -> bool:
        """Called by every rank at every step boundary (after `stepped` optimizer steps, the same
        sequence on every rank): whether to stop here."""
        if self.stop_after is None:
            self._learn(stepped)
        return self.stop_after is not None and stepped >= self.stop_after

    def _learn(self, stepped: int) -> None:
        if self.store is None:
            if self.flag.received is not None:
                self.stop_after, self.signal_name = stepped, self.flag.received
            return
        if self.flag.received is not None and not self._published:
            stop_after = -(-(stepped + 1) // self.every) * self.every  # the first read step >= stepped + 1
            self._adopt(self.store.compare_set(self.key, "", f"{stop_after}:{self.flag.received}"))
            self._published = True
        elif stepped % self.every == 0 and self.store.check([self.key]):
            self._adopt(self.store.get(self.key))

    def _adopt(self, raw: bytes) -> None:
        step, _, name = raw.decode().partition(":")
        self.stop_after, self.signal_name = int(step), name


class GraceDeadline:
    """After the notice, wait `grace_period_s` for the checkpoint; then requeue (if due) and exit.

    A daemon timer: the main thread may be stuck where no Python runs (a collective whose peer is
    gone), so only a thread can still end the process before the scheduler's SIGKILL."""

    def __init__(self, policy: PreemptionPolicy, global_rank: int) -> None:
        self.policy, self.global_rank = policy, global_rank
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.policy.grace_period_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        requeued = self.global_rank == 0 and self.policy.should_requeue() and requeue_slurm_job()
        print(f"[rank {self.global_rank}] preemption: no checkpoint within the grace period of "
              f"{self.policy.grace_period_s:g} s; exiting with code {PREEMPTED_EXIT_CODE} "
              f"{'after requeueing the job ' if requeued else ''}(the newest earlier checkpoint is the resume point).",
              file=sys.stderr, flush=True)
        os._exit(PREEMPTED_EXIT_CODE)


def reads_every(world_size: int) -> int:
    """How many steps apart every rank reads the agreement key: each step up to 64 ranks (about
    50 us of loopback round trip each), so the rendezvous store answers at most ~64 reads per step
    whatever the job's size; a 1024-rank job reads every 16 steps."""
    return max(1, -(-world_size // _READERS_PER_STEP))


_READERS_PER_STEP = 64


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes: an array task's "<array job>_<task>", else the job's."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def requeue_slurm_job() -> bool:
    """`scontrol requeue <job>`; True when it succeeded. A failure is reported, not raised: the
    checkpoint is written either way, and the job can be resubmitted by hand."""
    job_id = slurm_job_id()
    if job_id is None or not re.fullmatch(r"[0-9_]+", job_id):
        print(f"preemption: cannot requeue: SLURM job id {job_id!r} is missing or malformed.", file=sys.stderr)
        return False
    if shutil.which("scontrol") is None:
        print("preemption: cannot requeue: `scontrol` is not on PATH.", file=sys.stderr)
        return False
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"preemption: `scontrol requeue {job_id}` failed: {error}", file=sys.stderr)
        return False
    if result.returncode != 0:
        print(f"preemption: `scontrol requeue {job_id}` exited {result.returncode}: {result.stderr.strip()}",
              file=sys.stderr)
        return False
    print(f"preemption: SLURM job {job_id} requeued.", file=sys.stderr, flush=True)
    return True


class PreemptionWatch:
    """What one fit holds: the signal flag (installed while the fit runs), the agreement on the
    stop step and the grace deadline the first signal arms. Use as a context manager."""

    def __init__(self, policy: PreemptionPolicy, store: Any, key: str, global_rank: int, world_size: int = 1) -> None:
        self.policy, self.global_rank = policy, global_rank
        self.flag = SignalFlag(policy)
        self.agreement = StopAgreement(self.flag, store, key, every=reads_every(world_size))
        self.deadline = GraceDeadline(policy, global_rank)
        self.flag.on_first_signal = self.deadline.arm

    def __enter__(self) -> PreemptionWatch:
        self.flag.install()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.flag.uninstall()
        self.deadline.disarm()

    def due(self, stepped: int) -> bool:
        """Whether every rank stops after `stepped` optimizer steps (call at every step boundary)."""
        return self.policy.enabled and self.agreement.due(stepped)

    def stopped(self, step: int, checkpoint_path: str | None) -> Preempted:
        """The checkpoint is on disk (every rank passed its barrier): requeue from rank 0 when due,
        stop the deadline, and return the exception every rank raises."""
        self.deadline.disarm()
        requeued = self.global_rank == 0 and self.policy.should_requeue() and requeue_slurm_job()
        return Preempted(step, self.agreement.signal_name or "a preemption signal", checkpoint_path, requeued)
