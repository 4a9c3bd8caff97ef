"""The launching process's side of the local workers: start them once, hand them each stage,
watch them while it runs, and stop them all (or name the rank that failed).

One pool serves every stage of a strategy (fit, then validate/test/predict), so the workers,
their process group and their imports are paid for once per script, as with Lightning's `ddp`.
Any failure ends the whole pool within seconds; the next stage starts a fresh one. Nothing is
left behind: the workers end when told, when the launching process exits (atexit), or, if it
is killed, by themselves (strategies/worker.py watches for that).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from multiprocessing import forkserver
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from strategies.hang_guard import LEDGER, write_failure_stamp
from strategies.rank_zero import rank_prefixed_message
from strategies.worker import STOP, Order, WorkerSpec, worker_main

T = TypeVar("T")

_STOP_WAIT_S = 10
_EXIT_CODE_WAIT_S = 2  # for a worker whose pipe closed, until its exit code is known
# Sent to the launching process's main thread when its stage must stop: it ignores it by default,
# and Python programs have no other use for it.
_WAKE_SIGNAL = signal.SIGURG
# How a collective's error reads when a peer went away (gloo, NCCL): rank 0 then waits for the death.
_PEER_GONE_WORDS = ("connection", "closed", "reset by peer", "gloo", "nccl", "broken pipe")
# What the forkserver imports once, so that every worker forked from it starts with them imported.
# Installed packages only: before Python 3.12.8 the server ignores the launcher's sys.path, so a
# name the user's working directory also has (a folder "strategies") would load the wrong module.
# Nothing that creates per-process state a fork would share: numpy >= 2 makes its global generator
# (from fresh entropy) when `numpy.random` is first imported, which happens in each worker.
_FORKSERVER_PRELOAD = ["torch", "torch.distributed"]
# The forkserver passes at most 255 descriptors to a child: beyond this many local workers, spawn.
_MOST_FORKED_WORKERS = 64


class WorkerFailedError(RuntimeError):
    """A worker raised or died; `rank` is the first rank that failed, `traceback` its traceback
    (None when it was killed by a signal), `exitcode` its exit status."""

    def __init__(self, rank: int, message: str, traceback: str | None = None, exitcode: int | None = None) -> None:
        super().__init__(rank_prefixed_message(message, rank))
        self.rank, self.traceback, self.exitcode = rank, traceback, exitcode


class WorkerPool:
    """Local worker processes for global ranks 1..`nprocs`-1 of one process group, alive until
    `close()`; global rank 0 is the launching process itself (`run`'s `run_here`)."""

    def __init__(self, nprocs: int, start_method: str) -> None:
        self.nprocs, self.requested_start_method = nprocs, start_method
        self._resources = contextlib.ExitStack()
        self._connections: list[Connection] = []
        self._processes: list[Any] = []
        self._stage: _StageWatch | None = None
        # What the user chose for processes a rank starts (a DataLoader's workers): None means
        # the platform's default, which a worker started by a forkserver or spawn would not have.
        self._user_start_method = multiprocessing.get_start_method(allow_none=True)
        try:
            self.run_dir = Path(self._resources.enter_context(tempfile.TemporaryDirectory(prefix="ddp-trainer-")))
            self.failures_dir = self.run_dir / "failures"
            self.failures_dir.mkdir()
            self.start_method = self._resources.enter_context(_worker_start_method(start_method, nprocs - 1))
            # The group's rendezvous store lives here, on a port the OS picked, so no rank races
            # another program for it and a restarted pool never reads a failed group's keys.
            self.store = dist.TCPStore("127.0.0.1", 0, nprocs, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(minutes=30))
            self._base_env = dict(os.environ)
            self._start_workers()
        except BaseException:
            self.close()
            raise

    def _start_workers(self) -> None:
        context: Any = multiprocessing.get_context(self.start_method)
        with _main_without_a_missing_file():
            for rank in range(1, self.nprocs):
                self._start_worker(context, rank)

    def _start_worker(self, context: Any, local_rank: int) -> None:
        ours, theirs = context.Pipe()
        spec = WorkerSpec(local_rank, self.nprocs, self.store.port, str(self.failures_dir), self.start_method,
                          self._user_start_method)
        process = context.Process(target=worker_main, args=(spec, theirs), name=f"ddp-trainer-rank-{local_rank}")
        process.start()
        theirs.close()
        self._connections.append(ours)
        self._processes.append(process)

    @property
    def alive(self) -> bool:
        return bool(self._processes) and all(process.is_alive() for process in self._processes)

    def run(self, payload_path: str, run_here: Callable[[], T], restart_count: int = 0,
            notice_signals: tuple[str, ...] = ()) -> T:
        """Run one stage: the workers load it from `payload_path`, this process runs `run_here()` as
        global rank 0; return its result once every worker has finished too. `notice_signals` are
        the preemption signals the workers hold from the stage's start (strategies/preemption.py).

        A worker that raises or dies closes the pool and raises `WorkerFailedError` here, also when
        this process was busy or blocked in a collective: the other workers are killed (so a
        collective waiting for them fails) and `run_here` is interrupted (`StageInterrupted`). When
        `run_here` raises on its own, the workers are stopped and its exception goes on as it is.
        """
        order = Order(payload_path, self._env_changes(), os.getcwd(), restart_count, notice_signals)
        message = pickle.dumps(order, protocol=pickle.HIGHEST_PROTOCOL)
        self._stage = watch = _StageWatch(self)
        try:
            for connection in self._connections:
                connection.send_bytes(message)
            watch.start()
            try:
                result = run_here()
            finally:
                watch.disarm()
            watch.wait_for_answers(_STOP_WAIT_S)
        except BaseException as error:
            watch.closing = True
            failure = watch.failure or self._failure_behind(error)
            self.close(graceful=False)
            watch.join(_STOP_WAIT_S)  # it ends as the pipes close
            if failure is not None:
                raise failure from None
            raise
        finally:
            self._stage = None
        return result

    def fail_stage(self, rank: int, message: str) -> None:
        """End the running stage from another thread of this process (the hang guard of rank 0): the
        workers are killed and the stage's thread is interrupted, raising `WorkerFailedError(rank)`."""
        write_failure_stamp(self.failures_dir, message, rank)
        watch = self._stage
        if watch is not None:
            watch.fail(first_failure({}, self.failures_dir))

    def _failure_behind(self, error: BaseException) -> WorkerFailedError | None:
        """The worker failure that made this rank's stage fail with `error`, if any. A worker's death
        closes its connections, which a collective here reports a moment before the death can be
        read: such an error waits briefly for it; rank 0's own error (a bug in its step) does not."""
        deadline = time.monotonic() + (_EXIT_CODE_WAIT_S if _peer_connection_error(error) else 0.0)
        while True:
            failed = self._exit_codes_of_the_dead()
            if failed or any(self.failures_dir.glob("*.json")):
                self._stop_processes(graceful=False)  # the peers' stamps are in by then
                return first_failure(failed, self.failures_dir)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def notify(self, signum: int) -> None:
        """Pass a signal on to every live worker (a preemption notice the launching process got)."""
        for process in self._processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    def _env_changes(self) -> dict[str, str | None]:
        """What this process's environment changed since the workers started (None: removed)."""
        now = dict(os.environ)
        changes: dict[str, str | None] = {key: value for key, value in now.items() if self._base_env.get(key) != value}
        changes.update({key: None for key in self._base_env if key not in now})
        return changes

    def _exit_codes_of_the_dead(self) -> dict[int, int]:
        """Workers that ended on their own, before any stop from here (their codes say why), by rank."""
        codes = {rank: process.exitcode for rank, process in enumerate(self._processes, start=1)}
        return {rank: code for rank, code in codes.items() if code is not None and code != 0}

    def close(self, graceful: bool = True) -> None:
        """Stop every worker, then release the forkserver, the store and the folder."""
        self._stop_processes(graceful)
        self._resources.close()

    def _stop_processes(self, graceful: bool) -> None:
        """Tell every worker to stop (when `graceful`) and wait a while, then SIGKILL those alive.

        Not SIGTERM: while a stage runs, a worker takes SIGTERM as a preemption notice (it would
        wait for a step boundary a failed group never reaches), and its default action never ran
        Python's clean-up either; SIGKILL ends it as promptly and as cleanly."""
        if graceful:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.send_bytes(pickle.dumps(STOP))
            _wait_for_exit(self._processes, _STOP_WAIT_S)
        for process in self._processes:
            if process.is_alive():
                process.kill()
            process.join()
        for connection in self._connections:
            connection.close()
        self._processes, self._connections = [], []

    def kill_workers(self) -> None:
        """SIGKILL every worker at once (from any thread): a collective of this rank waiting for
        them fails instead of waiting for the group's timeout."""
        for process in list(self._processes):
            with contextlib.suppress(Exception):
                if process.is_alive():
                    process.kill()


class StageInterrupted(BaseException):
    """Raised inside the launching process's stage when a worker failed meanwhile (a BaseException,
    so a user's `except Exception` in a step cannot swallow it); `WorkerPool.run` replaces it with the
    worker's `WorkerFailedError`."""


class _StageWatch:
    """A thread of the launching process that watches the workers while a stage runs there: it
    collects their answers, and on the first failure kills the others and interrupts the stage."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.failure: WorkerFailedError | None = None
        self.closing = False  # the pool is being closed under this watch: nothing it sees is news
        self._stage_thread = threading.get_ident()
        self._lock = threading.Lock()
        self._armed = True  # the stage's own code still runs: a failure interrupts it
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
            _clear_async_exception(self._stage_thread)
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
            self.pool.kill_workers()
            if self._armed:
                _raise_in_thread(self._stage_thread, StageInterrupted)
                if self._in_main_thread:
                    signal.pthread_kill(self._stage_thread, _WAKE_SIGNAL)

    def _watch(self) -> None:
        try:
            self._collect_answers()
        except _WorkerDied as died:
            if not self.closing:
                self.fail(self._failure_of(died.rank))
        except Exception as error:  # noqa: BLE001 - reported as the stage's failure, never lost
            if not self.closing:
                self.fail(WorkerFailedError(0, f"watching the workers failed: {error!r}"))

    def _collect_answers(self) -> None:
        waiting = dict(enumerate(self.pool._connections, start=1))
        sentinels = {process.sentinel: rank for rank, process in enumerate(self.pool._processes, start=1)}
        while waiting and not self.closing:
            for ready in wait([*waiting.values(), *sentinels]):
                if ready in sentinels:
                    if sentinels[ready] in waiting:  # a worker ended in the middle of the stage
                        raise _WorkerDied(sentinels[ready])
                    continue
                rank = next(r for r, connection in waiting.items() if connection is ready)
                try:
                    waiting.pop(rank).recv_bytes()
                except (EOFError, OSError):
                    raise _WorkerDied(rank) from None

    def _failure_of(self, rank: int) -> WorkerFailedError:
        """Name the root cause once worker `rank` ended (its pipe can close a moment before its exit
        code is known): a rank killed by a signal, else the earliest stamped traceback."""
        self.pool._processes[rank - 1].join(timeout=_EXIT_CODE_WAIT_S)
        failed = self.pool._exit_codes_of_the_dead()
        if not failed:  # it left with code 0 (sys.exit() in a step)
            failed = {rank: 0}
        return first_failure(failed, self.pool.failures_dir)


def _wake_up(signum: int, frame: Any) -> None:
    """Nothing to do: running this handler is Python code, where the pending `StageInterrupted` is
    raised (in `time.sleep`, a pipe read, ... of the stage's main thread)."""


def _raise_in_thread(thread_id: int, exception: type[BaseException]) -> None:
    """Raise `exception` in thread `thread_id` as soon as it runs Python code again (a blocking
    call returns first: a collective whose peers were killed fails at once)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exception))


def _clear_async_exception(thread_id: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)


def _peer_connection_error(error: BaseException) -> bool:
    """Whether `error` is how a collective reports a peer that went away (gloo: the connection
    closed or was reset; NCCL: the communicator was aborted)."""
    if isinstance(error, (StageInterrupted, ConnectionError)):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(word in text for word in _PEER_GONE_WORDS)


class _WorkerDied(Exception):
    """Internal: worker `rank` ended (or its pipe closed) while a stage was running."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.rank = rank


@contextlib.contextmanager
def _main_without_a_missing_file() -> Iterator[None]:
    """multiprocessing re-runs the script of `__main__` in each new worker from `__main__.__file__`;
    a script read from stdin names "<stdin>", which is no file. Hide such a name while workers
    start: the worker then skips the re-run, as it does for a notebook (whose `__main__` has no
    file), and the classes it defines travel by value instead."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    missing = path is not None and getattr(main, "__spec__", None) is None and not os.path.isfile(path)
    if missing:
        del main.__file__  # type: ignore[union-attr]
    try:
        yield
    finally:
        if missing:
            main.__file__ = path  # type: ignore[union-attr]


def _wait_for_exit(processes: list[Any], timeout_s: float) -> None:
    alive = [process.sentinel for process in processes if process.is_alive()]
    deadline = time.monotonic() + timeout_s
    while alive and (left := deadline - time.monotonic()) > 0:
        for sentinel in wait(alive, timeout=left):
            alive.remove(sentinel)


# ---------------------------------------------------------------------- naming the failure
def first_failure(exit_codes: dict[int, int], failures_dir: Path) -> WorkerFailedError:
    """Pick the root cause among the workers that ended on their own (`exit_codes`, by rank): a
    rank killed by a signal, else the earliest Python failure stamped in `failures_dir`."""
    stamps = {int(path.stem): json.loads(path.read_text()) for path in failures_dir.glob("*.json")}
    for rank, code in sorted(exit_codes.items()):
        if code < 0 and rank not in stamps:
            return _killed_by_signal(rank, code, failures_dir)
    if stamps:
        rank = min(stamps, key=lambda r: stamps[r]["time_ns"])
        text = stamps[rank]["traceback"].rstrip()
        last_line = text.splitlines()[-1] if text else "unknown error"
        details = f"\n{text}" if "\n" in text else ""  # a one-line verdict (the hang guard's) is said once
        return WorkerFailedError(rank, f"worker failed: {last_line}{details}", traceback=text,
                                 exitcode=exit_codes.get(rank))
    rank, code = min(exit_codes.items()) if exit_codes else (0, 0)
    return WorkerFailedError(rank, f"worker exited with code {code} in the middle of a stage without raising; its "
                             f"stderr above shows why. A script that launches must guard its entry point with "
                             f"`if __name__ == \"__main__\":` (spawn re-imports it).", exitcode=code)


def _killed_by_signal(rank: int, code: int, failures_dir: Path) -> WorkerFailedError:
    """A rank that died without raising: say how, and where its Python code was when it did."""
    if code == -signal.SIGABRT:
        cause = ("the C++ runtime aborted it; gloo does this when ranks issue different collectives (its message "
                 "above says 'collective mismatch': e.g. self.log(..., sync_dist=True) on one rank only). Rerun "
                 "with DDPStrategy(debug_collectives=True) (strategy.debug_collectives=true) to name the first "
                 "collective that differs and its call site on every rank.")
    else:
        cause = "a kill by the OOM killer or an outside `kill` looks like this."
    fault = Path(failures_dir, f"{rank}.fault")
    stack = fault.read_text().strip() if fault.exists() else ""
    where = f"\nIts Python stack when it died:\n{stack}" if stack else ""
    name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
    return WorkerFailedError(rank, f"worker was killed by signal {-code} ({name}) before it could raise; "
                             f"{cause}{where}", exitcode=code)


# ---------------------------------------------------------------------- how workers start
@contextlib.contextmanager
def _worker_start_method(requested: str, nprocs: int) -> Iterator[str]:
    """Yield the multiprocessing start method of this pool's workers, and own its forkserver.

    With spawn every worker imports torch itself (~1 s each, and two imports on two cores are
    slower than one). A forkserver started here imports torch once *while* this process writes
    the payload; each worker is then forked from it with torch imported. The server is this
    pool's own and is stopped with it: a worker inherits the server's environment and file
    descriptors, so a server that outlived its pool would hand the next one a stale os.environ
    or stdout (and the server reports its workers' exit codes, so it must outlive them). A
    server someone else started is not borrowed: then, as where the platform has no forkserver,
    workers are spawned. Plain fork is never used: a child forked from a process whose OpenMP
    pool has run hangs in its first multi-threaded op. Forked workers share the server's
    string-hash seed, where spawned ones draw one each.
    """
    server = _startable_forkserver() if requested == "forkserver" and _forking_is_safe(nprocs) else None
    if server is None:
        yield "spawn"
        return
    previous_preload = server._preload_modules
    forkserver.set_forkserver_preload(_FORKSERVER_PRELOAD)
    try:
        forkserver.ensure_running()  # returns at once: the server imports in the background
        yield "forkserver"
    finally:
        try:
            _stop_forkserver(server)
        finally:
            forkserver.set_forkserver_preload(previous_preload)


def _forking_is_safe(nprocs: int) -> bool:
    """Whether workers forked from one server would still be as independent as spawned ones:
    numpy < 2 imports `numpy.random` with numpy, which would give every rank the server's global
    generator, and more workers than the server can pass descriptors to would fail to start."""
    numpy = sys.modules.get("numpy")
    old_numpy = numpy is not None and int(str(getattr(numpy, "__version__", "2")).split(".")[0]) < 2
    return not old_numpy and nprocs <= _MOST_FORKED_WORKERS


def _startable_forkserver() -> Any | None:
    """The stdlib's forkserver singleton when we can start (and later stop) a server of our own.

    Its pid and `_stop` are private to CPython; if they are missing (another version) or a server
    already runs, None, and the caller spawns instead.
    """
    server = getattr(forkserver, "_forkserver", None)
    layout_known = server is not None and hasattr(server, "_stop") and hasattr(server, "_preload_modules")
    if "forkserver" not in multiprocessing.get_all_start_methods() or not layout_known:
        return None
    return server if getattr(server, "_forkserver_pid", 0) is None else None


def _stop_forkserver(server: Any) -> None:
    """Kill the server, then let the stdlib reap it. Its own `_stop` alone waits until every
    process holding the server's "alive" pipe exits, which a stray grandchild could make forever."""
    pid = server._forkserver_pid
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        try:
            server._stop()
        except ChildProcessError:  # reaped already (the caller ignores SIGCHLD): forget it as _stop would
            server._forkserver_pid = server._forkserver_address = None
