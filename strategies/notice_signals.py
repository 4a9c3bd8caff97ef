"""Catching a preemption notice in one process, and the deadline it starts.

The handlers only record the signal (no I/O, no collective: a handler runs between two bytecodes of
whatever the main thread was doing); the training loop acts on it at its next step boundary.
Handlers can be set from the main thread only; elsewhere (a fit run in a thread) nothing is
installed, and the process still stops when the other ranks agree to.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from strategies.slurm_requeue import requeue_slurm_job

EXIT_CODE = 75  # sysexits' EX_TEMPFAIL, "try again later": what a requeue does (PREEMPTED_EXIT_CODE)

# Notices a worker received outside a fit (while a stage sets up, between stages, while it answers),
# with when they came: the next fit's SignalFlag takes the newest over.
_HELD: list[tuple[str, float]] = []
_HOLDING: set[int] = set()


def replace_handlers(signals: tuple[str, ...], handler: Callable[[int, Any], None]) -> Callable[[], None]:
    """Install `handler` for `signals` (main thread only; elsewhere nothing happens) and return what
    puts the previous handlers back."""
    if not signals or threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {number: signal.signal(number, handler) for number in (signal.Signals[name] for name in signals)}

    def restore() -> None:
        for number, handler_before in previous.items():
            signal.signal(number, handler_before if handler_before is not None else signal.SIG_DFL)

    return restore


def hold_notices(signals: tuple[str, ...]) -> None:
    """In a worker, for the rest of its life: record these signals instead of dying of them (a notice
    the launching process forwarded must not kill a worker that is answering or idle). Idempotent."""
    if threading.current_thread() is not threading.main_thread():
        return
    for number in (signal.Signals[name] for name in signals):
        if number not in _HOLDING:
            signal.signal(number, _hold)
            _HOLDING.add(number)


def forget_held_notices() -> None:
    """A new stage starts: what was held before belongs to no fit."""
    _HELD.clear()


def _hold(signum: int, frame: Any) -> None:
    _HELD.append((signal.Signals(signum).name, time.monotonic()))


class SignalFlag:
    """Records the first of `signals` this process receives between `install` and `uninstall`
    (and one a worker held since its stage began)."""

    def __init__(self, signals: tuple[str, ...], on_first: Callable[[float], None] | None = None) -> None:
        self.signals, self.on_first = signals, on_first
        self.received: str | None = None
        self._restore: Callable[[], None] = lambda: None

    def install(self) -> None:
        self._restore = replace_handlers(self.signals, self._handle)
        held = [(name, when) for name, when in _HELD if name in self.signals]
        if held:
            self._record(*held[0])

    def uninstall(self) -> None:
        self._restore()
        self._restore = lambda: None

    def _handle(self, signum: int, frame: Any) -> None:
        self._record(signal.Signals(signum).name, time.monotonic())

    def _record(self, name: str, when: float) -> None:
        if self.received is not None:
            return
        self.received = name
        print(f"[rank {os.environ.get('RANK', '0')}] {name} received: checkpointing at the next step boundary "
              "the ranks agree on, then exiting (preemption).", file=sys.stderr, flush=True)
        if self.on_first is not None:
            self.on_first(when)


class GraceDeadline:
    """`grace_s` after the notice, if the checkpoint has not been written: requeue (rank 0, when due)
    and exit with the preemption code before the scheduler's SIGKILL. A daemon timer: the main thread
    may be stuck where no Python runs (a collective whose peer is gone)."""

    def __init__(self, grace_s: float, requeue: bool, global_rank: int) -> None:
        self.grace_s, self.requeue, self.global_rank = grace_s, requeue, global_rank
        self._timer: threading.Timer | None = None

    def arm(self, since: float | None = None) -> None:
        """Start counting from `since` (time.monotonic() of the notice; now by default). Idempotent."""
        if self._timer is not None:
            return
        left = self.grace_s - (time.monotonic() - since if since is not None else 0.0)
        self._timer = threading.Timer(max(0.0, left), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        requeued = self.global_rank == 0 and self.requeue and requeue_slurm_job()
        print(f"[rank {self.global_rank}] preemption: no checkpoint within the grace period of {self.grace_s:g} s; "
              f"exiting with code {EXIT_CODE} {'after requeueing the job ' if requeued else ''}(the newest earlier "
              "checkpoint is the resume point).", file=sys.stderr, flush=True)
        os._exit(EXIT_CODE)
