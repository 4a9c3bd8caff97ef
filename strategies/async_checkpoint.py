"""Writing checkpoints in the background on global rank 0: snapshot now, write on a thread.

The rules (issue #40), each kept here in one place:

* **One save in flight.** `submit` first waits for the previous write; that wait is counted
  (`CheckpointSaveStats.waits`, `wait_s`) and logged, so a save interval shorter than a write shows.
* **A consistent snapshot.** The dict is copied on the training thread before `submit` returns
  (strategies/checkpoint_snapshot.py); the thread writes only the copy.
* **Atomic.** The thread calls the strategy's `CheckpointIO.save` (temp file, fsync, rename): a file
  appears whole or not at all, also when the process dies mid-write.
* **Old files go after the new one is on disk.** `after_commit` holds what must wait for the write in
  flight (ModelCheckpoint's top-k and `last` removals, the `last` link) and runs it once the write is
  committed; if the write fails, none of it runs, so the previous checkpoint stays.
* **Errors are never lost.** A failed write is kept and raised on the training thread by the next
  `raise_if_failed` (every step), `wait` (the next save, fit end) or `close` (teardown), naming the
  file and the cause, as the synchronous save would have.
* **Nothing pending at exit.** `close` (strategy teardown: fit end, an exception, Ctrl-C, before an
  elastic restart) waits for the write; an interpreter exiting without one waits too (atexit). A
  process killed mid-write leaves the previous file, never a partial one.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from strategies.checkpoint_io import CheckpointError, CheckpointIO
from strategies.checkpoint_snapshot import CheckpointSnapshot

log = logging.getLogger(__name__)


@dataclass
class CheckpointSaveStats:
    """What the training side paid for background saves (seconds); read by tests and summaries."""

    saves: int = 0             # background saves submitted
    committed: int = 0         # of those, written and renamed into place
    waits: int = 0             # saves (or a synchronous save, or teardown) that found the previous write running
    wait_s: float = 0.0        # total time spent waiting for it
    snapshot_s: float = 0.0    # total time copying state on the training thread
    last_stall_s: float = 0.0  # the latest background save's stall: its wait plus its snapshot
    last_write_s: float = 0.0  # the latest write's duration on the writer thread

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Write:
    """One write in flight: its thread, the actions waiting for its commit, and its outcome."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.after_commit: list[Callable[[], None]] = []
        self.error: BaseException | None = None
        self.done = False  # the write ended (committed or failed); set under `lock`
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None


class BackgroundCheckpointWriter:
    """Rank 0's background writer for one strategy (created on its first background save)."""

    def __init__(self, checkpoint_io: CheckpointIO) -> None:
        self.checkpoint_io = checkpoint_io
        self.stats = CheckpointSaveStats()
        self._snapshot = CheckpointSnapshot()
        self._write: _Write | None = None
        self._failed: _Write | None = None

    def submit(self, checkpoint: dict[str, Any], path: str) -> None:
        """Snapshot `checkpoint` and write it to `path` on the writer thread; returns when the state may
        change again. Raises an earlier background write's error first."""
        waited = self.wait()
        start = time.perf_counter()
        copied = self._snapshot.take(checkpoint)
        snapshot_s = time.perf_counter() - start
        _OPEN_WRITERS.add(self)
        self.stats.saves += 1
        self.stats.snapshot_s += snapshot_s
        self.stats.last_stall_s = waited + snapshot_s
        write = _Write(str(path))
        write.thread = threading.Thread(target=self._run, args=(write, copied), daemon=True,
                                        name=f"ddp-trainer-checkpoint-writer {Path(path).name}")
        self._write = write
        write.thread.start()

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once the write in flight is committed (now if none is); dropped if it fails."""
        write = self._write
        if write is not None:
            with write.lock:
                if not write.done:
                    write.after_commit.append(action)
                    return
            if write.error is not None:
                return  # the new file is not there: keep what `action` would remove
        action()

    def wait(self) -> float:
        """Block until no write is in flight; raise its error. Returns the seconds waited."""
        write, waited = self._write, 0.0
        if write is not None and write.thread is not None:
            if write.thread.is_alive():
                start = time.perf_counter()
                write.thread.join()
                waited = time.perf_counter() - start
                self.stats.waits += 1
                self.stats.wait_s += waited
                log.info("checkpoint save waited %.3f s for the previous write (%s) to finish", waited, write.path)
            self._write = None
            if write.error is not None:
                self._failed = write
        self.raise_if_failed()
        return waited

    def raise_if_failed(self) -> None:
        """On the training thread: raise the error of a background write that failed (once)."""
        write = self._write
        if write is not None and write.done and write.error is not None:
            self._write, self._failed = None, write
        failed, self._failed = self._failed, None
        if failed is not None and failed.error is not None:
            raise _training_side_error(failed.path, failed.error) from failed.error

    def close(self) -> None:
        """Wait for the write in flight (teardown). Its error is raised, unless an exception is
        already on its way out (Ctrl-C, a failing rank): then it is logged, not put in its place."""
        _OPEN_WRITERS.discard(self)
        if sys.exc_info()[1] is None:
            self.wait()
            return
        try:
            self.wait()
        except CheckpointError as error:
            log.error("%s", error)

    def _run(self, write: _Write, copied: dict[str, Any]) -> None:
        start = time.perf_counter()
        _yield_to_training()
        try:
            self._snapshot.ready()
            self.checkpoint_io.save(copied, write.path)
            self.stats.committed += 1
            self.stats.last_write_s = time.perf_counter() - start
        except BaseException as error:  # noqa: BLE001 (kept and raised on the training thread)
            write.error = error
        with write.lock:
            write.done = True
            actions = [] if write.error is not None else list(write.after_commit)
        try:
            for action in actions:
                action()
        except BaseException as error:  # noqa: BLE001 (a removal that failed: raised like a failed write)
            write.error = error


_OPEN_WRITERS: weakref.WeakSet[BackgroundCheckpointWriter] = weakref.WeakSet()
WRITER_NICENESS = 10  # added to the writer thread's nice value: it takes the CPU time training leaves


def _yield_to_training() -> None:
    """Lower this (writer) thread's CPU priority, where the OS schedules threads by nice value (Linux):
    serialising and copying a checkpoint into the page cache then uses cores the training leaves idle, and
    on a busy machine slows the write rather than the steps. The training threads keep their priority."""
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + WRITER_NICENESS)
    except (AttributeError, OSError):  # no per-thread priorities here: the write simply competes as it is
        pass


def _training_side_error(path: str, error: BaseException) -> CheckpointError:
    """The error a synchronous save would have raised (CheckpointIO's own message names the file and
    the cause), saying that the write ran in the background."""
    detail = str(error) if isinstance(error, CheckpointError) else \
        f"Could not write checkpoint {path!r}: {type(error).__name__}: {error}"
    return CheckpointError(f"{detail} [written in the background (async_checkpoint); raised at the first step, "
                           "save or fit end after the write failed]")


def _wait_for_open_writers() -> None:
    """At interpreter exit: let a write in flight finish (its thread is a daemon, so that a second
    Ctrl-C is not held up by it, but a script that simply ends must not lose its last checkpoint)."""
    for writer in list(_OPEN_WRITERS):
        write = writer._write
        if write is not None and write.thread is not None:
            write.thread.join()


atexit.register(_wait_for_open_writers)
