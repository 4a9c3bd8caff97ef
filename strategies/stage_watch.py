"""The launching process's lookout while a stage runs there as global rank 0.

Rank 0 runs the user's code in the calling thread, so it cannot also wait for the workers. A
`StageWatch` thread does: it collects each worker's answer, and on the first failure kills the
other workers (a collective waiting for them then fails at once) and interrupts the stage's
thread with `StageInterrupted`, also when that thread sleeps or blocks in a system call.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from strategies.hang_guard import LEDGER
from strategies.worker_failure import (EXIT_CODE_WAIT_S, StageInterrupted, WorkerFailedError, failed_exit_codes,
                                       first_failure)

# Sent to the launching process's main thread when its stage must stop: it ignores it by default,
# and Python programs have no other use for it.
_WAKE_SIGNAL = signal.SIGURG
# How long a worker's failure waits for rank 0's own code to end before interrupting it: ranks that make
# the same check at the same point (the non-finite check) fail together, and rank 0's own exception is
# what the caller should get (worker_failure.failed_alike), not an interruption a moment before it.
_OWN_END_GRACE_S = 0.5


class StageWatch:
    """A thread of the launching process that watches the workers (global ranks 1.., one pipe and
    one process each) while a stage runs there: it collects their answers, and on the first failure
    calls `kill_workers` and interrupts the stage."""

    def __init__(self, connections: list[Connection], processes: list[Any], failures_dir: Path,
                 kill_workers: Callable[[], None]) -> None:
        self._connections, self._processes, self._failures_dir = connections, processes, failures_dir
        self._kill_workers = kill_workers
        self.failure: WorkerFailedError | None = None
        self.closing = False  # the pool is being closed under this watch: nothing it sees is news
        self._stage_thread = threading.get_ident()
        self._lock = threading.Lock()
        self._armed = True  # the stage's own code still runs: a failure interrupts it
        self._interrupted = False  # an interruption was sent to the stage's thread
        self._ended = threading.Event()  # the stage's own code has ended (`disarm`)
        self._thread = threading.Thread(target=self._watch, name="ddp-trainer-stage-watch", daemon=True)
        self._in_main_thread = threading.current_thread() is threading.main_thread()
        self._previous_handler: Any = None

    def start(self) -> None:
        if self._in_main_thread:  # a signal wakes a main thread that sleeps or waits in a system call
            self._previous_handler = signal.signal(_WAKE_SIGNAL, _wake_up)
        self._thread.start()

    def disarm(self) -> None:
        """The stage's own code has ended: no interruption may reach the code that follows it."""
        with self._lock:
            self._armed = False
            self._ended.set()
            if self._interrupted:
                _absorb_interruption(self._stage_thread)
        if self._in_main_thread:
            signal.signal(_WAKE_SIGNAL, self._previous_handler)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def wait_for_answers(self, timeout_s: float) -> None:
        """Wait until every worker answered (they passed the stage's last barrier with this rank, so
        they answer at once) or one failed; raise that failure."""
        self.join(timeout_s)
        if self.failure is not None:
            raise self.failure
        if self._thread.is_alive() and not self.closing:
            raise WorkerFailedError(0, f"the workers did not finish the stage within {timeout_s:g} s of rank 0")

    def fail(self, failure: WorkerFailedError) -> None:
        """Record the stage's failure (the first one counts), kill the workers, interrupt the stage."""
        with self._lock:
            if self.failure is not None or self.closing:
                return
            self.failure = failure
            LEDGER.aborted = str(failure).splitlines()[0]  # a wait this rank polls itself stops too
            self._kill_workers()
            if self._armed:
                self._interrupted = True
                _raise_in_thread(self._stage_thread, StageInterrupted)
                if self._in_main_thread:
                    signal.pthread_kill(self._stage_thread, _WAKE_SIGNAL)

    def _watch(self) -> None:
        try:
            self._collect_answers()
        except _WorkerDied as died:
            if not self.closing:
                failure = self._failure_of(died.rank)
                self._ended.wait(_OWN_END_GRACE_S)  # rank 0 failing the same check is a moment behind
                self.fail(failure)
        except Exception as error:  # noqa: BLE001 - reported as the stage's failure, never lost
            if not self.closing:
                self.fail(WorkerFailedError(0, f"watching the workers failed: {error!r}"))

    def _collect_answers(self) -> None:
        waiting = dict(enumerate(self._connections, start=1))
        sentinels = {process.sentinel: rank for rank, process in enumerate(self._processes, start=1)}
        while waiting and not self.closing:
            for ready in wait([*waiting.values(), *sentinels]):
                if ready in sentinels:
                    rank = sentinels[ready]
                    # A rank that ended in the middle of the stage; a forked rank ends right after its
                    # answer, which may be read after its exit is seen.
                    if rank in waiting and not _answered(waiting[rank]):
                        raise _WorkerDied(rank)
                    del sentinels[ready]  # an ended process stays ready: never wait on it again
                    continue
                rank = next(r for r, connection in waiting.items() if connection is ready)
                try:
                    waiting.pop(rank).recv_bytes()
                except (EOFError, OSError):
                    raise _WorkerDied(rank) from None

    def _failure_of(self, rank: int) -> WorkerFailedError:
        """Name the root cause once worker `rank` ended (its pipe can close a moment before its exit
        code is known): a rank killed by a signal, else the earliest stamped traceback."""
        self._processes[rank - 1].join(timeout=EXIT_CODE_WAIT_S)
        failed = failed_exit_codes(self._processes)
        if not failed:  # it left with code 0 (sys.exit() in a step)
            failed = {rank: 0}
        return first_failure(failed, self._failures_dir)


def _answered(connection: Connection) -> bool:
    try:
        return connection.poll()
    except (EOFError, OSError):
        return False


def _wake_up(signum: int, frame: Any) -> None:
    """Nothing to do: running this handler is Python code, where the pending `StageInterrupted` is
    raised (in `time.sleep`, a pipe read, ... of the stage's main thread)."""


def _raise_in_thread(thread_id: int, exception: type[BaseException]) -> None:
    """Raise `exception` in thread `thread_id` as soon as it runs Python code again (a blocking
    call returns first: a collective whose peers were killed fails at once)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exception))


def _absorb_interruption(thread_id: int) -> None:
    """Called in the stage's thread `thread_id`: an interruption still pending there is not raised.

    Not by clearing it (`PyThreadState_SetAsyncExc(id, NULL)`): CPython before 3.13 then keeps its
    "asynchronous exception pending" flag set for the whole interpreter, which only an exception's
    delivery resets; every later function call checks for it again, and under a profiler or a tracer
    (cProfile, pdb, coverage) the next call loops on that check forever. So an exception of our own
    replaces the pending one, and is delivered and caught right here."""
    try:
        _raise_in_thread(thread_id, _Absorbed)
        _deliver_pending()
    except _Absorbed:
        pass


def _deliver_pending() -> None:
    """A function call: a pending asynchronous exception is raised at its entry, if not before."""


class _Absorbed(BaseException):
    """Internal: replaces a pending `StageInterrupted` that came too late to matter."""


class _WorkerDied(Exception):
    """Internal: worker `rank` ended (or its pipe closed) while a stage was running."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.rank = rank
