"""The launching process's side of the local workers: start them once, hand them each stage,
watch them while it runs, and stop them all (or name the rank that failed).

One pool serves every stage of every strategy of the process with its world size and device kind
(fit, then validate/test/predict, then the next Trainer's), so the workers, their process group and
their imports are paid for once per script, as with Lightning's `ddp` (strategies/launcher.py keeps
it). Ranks forked from the caller for one stage (strategies/forked_ranks.py) are watched the same way.
Any failure ends the whole pool within seconds; the next stage starts a fresh one. Nothing is
left behind: the workers end when told, when the launching process exits (atexit), or, if it
is killed, by themselves (strategies/worker.py watches for that).

The pool owns the processes' lifecycle; while a stage runs, a `StageWatch` (stage_watch.py) waits
for the workers' answers, `worker_failure.py` names the rank that failed first, and
`worker_start.py` decides how the processes start (forkserver or spawn).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from strategies.hang_guard import write_failure_stamp
from strategies.stage_watch import StageWatch
from strategies.worker import STOP, Order, WorkerSpec, worker_main
from strategies.worker_failure import (EXIT_CODE_WAIT_S, WorkerFailedError, failed_alike, failed_exit_codes,
                                       first_failure, peer_connection_error)
from strategies.worker_start import main_without_a_missing_file, worker_start_method

T = TypeVar("T")

_STOP_WAIT_S = 10


class WorkerPool:
    """Local worker processes for global ranks 1..`nprocs`-1 of one process group, alive until
    `close()`; global rank 0 is the launching process itself (`run`'s `run_here`)."""

    def __init__(self, nprocs: int, start_method: str) -> None:
        self.nprocs, self.requested_start_method = nprocs, start_method
        self._resources = contextlib.ExitStack()
        self._connections: list[Connection] = []
        self._processes: list[Any] = []
        self._stage: StageWatch | None = None
        # What the user chose for processes a rank starts (a DataLoader's workers): None means
        # the platform's default, which a worker started by a forkserver or spawn would not have.
        self._user_start_method = multiprocessing.get_start_method(allow_none=True)
        try:
            self.run_dir = Path(self._resources.enter_context(tempfile.TemporaryDirectory(prefix="ddp-trainer-")))
            self.failures_dir = self.run_dir / "failures"
            self.failures_dir.mkdir()
            self.start_method = self._resources.enter_context(worker_start_method(start_method, nprocs - 1))
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
        with main_without_a_missing_file():
            for rank in range(1, self.nprocs):
                self._start_worker(context, rank)

    def _start_worker(self, context: Any, local_rank: int) -> None:
        ours, theirs = context.Pipe()
        spec = WorkerSpec(local_rank, self.nprocs, self.store.port, str(self.failures_dir), self.start_method,
                          self._user_start_method)
        target, args = self._entry(spec, theirs)
        process = context.Process(target=target, args=args, name=f"ddp-trainer-rank-{local_rank}")
        process.start()
        theirs.close()
        self._connections.append(ours)
        self._processes.append(process)

    def _entry(self, spec: WorkerSpec, connection: Connection) -> tuple[Callable[..., None], tuple[Any, ...]]:
        """What a new rank process runs: a pool's worker loop."""
        return worker_main, (spec, connection)

    @property
    def alive(self) -> bool:
        return bool(self._processes) and all(process.is_alive() for process in self._processes)

    def run(self, payload_path: str, run_here: Callable[[], T], restart_count: int = 0,
            notice_signals: tuple[str, ...] = (), group_generation: int = 0) -> T:
        """Run one stage: the workers load it from `payload_path`, this process runs `run_here()` as
        global rank 0; return its result once every worker has finished too. `notice_signals` are
        the preemption signals the workers hold from the stage's start (strategies/preemption.py);
        `group_generation` numbers the process group the stage runs in (a new number: a new group).

        A worker that raises or dies closes the pool and raises `WorkerFailedError` here, also when
        this process was busy or blocked in a collective: the other workers are killed (so a
        collective waiting for them fails) and `run_here` is interrupted (`StageInterrupted`). When
        `run_here` raises on its own, the workers are stopped and its exception goes on as it is.
        """
        order = Order(payload_path, self._env_changes(), os.getcwd(), restart_count, notice_signals, group_generation)
        message = pickle.dumps(order, protocol=pickle.HIGHEST_PROTOCOL)

        def send() -> None:
            for connection in self._connections:
                connection.send_bytes(message)

        return self._run_stage(send, run_here)

    def _run_stage(self, send: Callable[[], None], run_here: Callable[[], T]) -> T:
        """`send` the stage to ranks 1.., run rank 0's part here while a `StageWatch` looks after them."""
        self._stage = watch = StageWatch(self._connections, self._processes, self.failures_dir, self.kill_workers)
        try:
            send()
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
            if failure is not None and not failed_alike(error, failure):
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
        deadline = time.monotonic() + (EXIT_CODE_WAIT_S if peer_connection_error(error) else 0.0)
        while True:
            failed = failed_exit_codes(self._processes)
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
            _kill(process)
            process.join()
        for connection in self._connections:
            connection.close()
        self._processes, self._connections = [], []

    def kill_workers(self) -> None:
        """SIGKILL every worker at once (from any thread): a collective of this rank waiting for
        them fails instead of waiting for the group's timeout."""
        for process in list(self._processes):
            _kill(process)


def _kill(process: Any) -> None:
    """SIGKILL a rank's process. A forkserver's child reads as ended (exit code 255) once the server is
    gone, though it may still run: it is killed by its pid all the same, unless it was reaped."""
    reaped = process.exitcode is not None and (process.exitcode != 255 or not _still_ours(process.pid))
    if not reaped and process.pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGKILL)


def _still_ours(pid: int) -> bool:
    """Whether `pid` still runs a multiprocessing child (not a process that reused the number)."""
    try:
        return b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _wait_for_exit(processes: list[Any], timeout_s: float) -> None:
    alive = [process.sentinel for process in processes if process.is_alive()]
    deadline = time.monotonic() + timeout_s
    while alive and (left := deadline - time.monotonic()) > 0:
        for sentinel in wait(alive, timeout=left):
            alive.remove(sentinel)
