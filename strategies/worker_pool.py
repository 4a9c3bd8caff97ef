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
import json
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing import forkserver
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch.distributed as dist

from strategies.rank_zero import rank_prefixed_message
from strategies.worker import STOP, Order, WorkerSpec, worker_main

_STOP_WAIT_S = 10
_EXIT_CODE_WAIT_S = 2  # for a worker whose pipe closed, until its exit code is known  # how long a told-to-stop worker may take to leave its process group
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
    """`nprocs` local worker processes with one process group, alive until `close()`."""

    def __init__(self, nprocs: int, start_method: str) -> None:
        self.nprocs, self.requested_start_method = nprocs, start_method
        self._resources = contextlib.ExitStack()
        self._connections: list[Connection] = []
        self._processes: list[Any] = []
        try:
            self.run_dir = Path(self._resources.enter_context(tempfile.TemporaryDirectory(prefix="ddp-trainer-")))
            self.failures_dir = self.run_dir / "failures"
            self.failures_dir.mkdir()
            self.start_method = self._resources.enter_context(_worker_start_method(start_method, nprocs))
            # The group's rendezvous store lives here, on a port the OS picked, so no rank races
            # another program for it and a restarted pool never reads a failed group's keys.
            self._store = dist.TCPStore("127.0.0.1", 0, nprocs, is_master=True, wait_for_workers=False,
                                        timeout=timedelta(minutes=30))
            self._base_env = dict(os.environ)
            self._start_workers()
        except BaseException:
            self.close()
            raise

    def _start_workers(self) -> None:
        context: Any = multiprocessing.get_context(self.start_method)
        with _main_without_a_missing_file():
            for local_rank in range(self.nprocs):
                self._start_worker(context, local_rank)

    def _start_worker(self, context: Any, local_rank: int) -> None:
        ours, theirs = context.Pipe()
        spec = WorkerSpec(local_rank, self.nprocs, self._store.port, str(self.failures_dir), self.start_method)
        process = context.Process(target=worker_main, args=(spec, theirs), name=f"ddp-trainer-rank-{local_rank}")
        process.start()
        theirs.close()
        self._connections.append(ours)
        self._processes.append(process)

    @property
    def alive(self) -> bool:
        return bool(self._processes) and all(process.is_alive() for process in self._processes)

    def run(self, payload_path: str, restart_count: int = 0, notice_signals: tuple[str, ...] = ()) -> bytes:
        """Run one stage on every worker; return global rank 0's pickled result. `notice_signals`
        are the preemption signals the workers hold from the stage's start (strategies/preemption.py).

        Raises `WorkerFailedError` (and closes the pool) when any worker raises or dies.
        """
        order = Order(payload_path, self._env_changes(), os.getcwd(), restart_count, notice_signals)
        message = pickle.dumps(order, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            for connection in self._connections:
                connection.send_bytes(message)
            answers = self._collect_answers()
        except (_WorkerDied, BrokenPipeError) as error:
            if isinstance(error, _WorkerDied):  # its pipe can close a moment before its exit code is known
                self._processes[error.rank].join(timeout=_EXIT_CODE_WAIT_S)
            failed = self._exit_codes_of_the_dead()
            if not failed and isinstance(error, _WorkerDied):  # it left with code 0 (sys.exit() in a step)
                failed = {error.rank: 0}
            self._stop_processes(graceful=False)  # the peers' stamps are in by then
            failure = first_failure(failed, self.failures_dir)
            self.close()
            raise failure from None
        except BaseException:  # Ctrl-C in this process, or any other surprise: no worker may outlive it
            self.close(graceful=False)
            raise
        return answers[0]

    def notify(self, signum: int) -> None:
        """Pass a signal on to every live worker (a preemption notice the launching process got)."""
        for process in self._processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    def _collect_answers(self) -> dict[int, bytes]:
        answers: dict[int, bytes] = {}
        waiting = dict(enumerate(self._connections))
        sentinels = {process.sentinel: rank for rank, process in enumerate(self._processes)}
        while waiting:
            for ready in wait([*waiting.values(), *sentinels]):
                if ready in sentinels:  # a worker ended in the middle of a stage
                    raise _WorkerDied(sentinels[ready])
                rank = next(r for r, connection in waiting.items() if connection is ready)
                try:
                    answers[rank] = waiting.pop(rank).recv_bytes()
                except (EOFError, OSError):
                    raise _WorkerDied(rank) from None
        return answers

    def _env_changes(self) -> dict[str, str | None]:
        """What this process's environment changed since the workers started (None: removed)."""
        now = dict(os.environ)
        changes: dict[str, str | None] = {key: value for key, value in now.items() if self._base_env.get(key) != value}
        changes.update({key: None for key in self._base_env if key not in now})
        return changes

    def _exit_codes_of_the_dead(self) -> dict[int, int]:
        """Workers that ended on their own, before any stop from here (their codes say why)."""
        codes = {rank: process.exitcode for rank, process in enumerate(self._processes)}
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
