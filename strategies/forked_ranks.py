"""Ranks 1..N-1 forked from the calling process for one stage, as Lightning's `ddp_notebook` forks.

A forked rank inherits the caller's objects as they are: nothing is pickled (a module holding a lock,
a datamodule holding a socket, a callback holding a generator all train) and nothing is imported
again; only the stage's process group is made. After that stage the ranks stay, with their group, as
the process's worker pool: a later stage whose work pickles (test after fit, the next Trainer) is sent
to them as to any pool, and one whose work does not is forked afresh. The launcher forks only where
that is safe (`fork_blocker`): the platform has fork, CUDA is neither
initialised in the caller nor wanted by the stage, and each rank runs one CPU thread (a process
forked after OpenMP's threads ran hangs in its first multi-threaded op). Elsewhere the process's
shared worker pool serves the stage (strategies/worker_pool.py).

The fork happens on the caller's thread before rank 0 starts the stage, so no lock of ours is held
(logging re-creates its own in the child; progress bars and loggers write on rank 0 only, never in a
forked rank). The caller's buffered stdout/stderr is flushed first, and the child ends through
`os._exit` (multiprocessing's), so it neither prints the caller's pending output a second time nor
runs the caller's exit handlers.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from strategies.worker import Order, WorkerSpec, cpu_threads_per_rank, forked_rank_main
from strategies.worker_pool import WorkerPool

if TYPE_CHECKING:
    from strategies.base import Strategy

T = TypeVar("T")

Work = tuple["Strategy", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def fork_blocker(nprocs: int, start_method: str, accelerator: str) -> str | None:
    """Why ranks 1..`nprocs`-1 cannot be forked from this process for a stage, or None when they can."""
    if start_method == "spawn":
        return "start_method='spawn' was chosen (ranks get a pickled copy of the work)"
    if "fork" not in multiprocessing.get_all_start_methods():
        return "this platform has no fork"
    if accelerator == "cuda" or _cuda_in_use():
        return "the stage uses CUDA, which a forked process cannot use once its parent initialised it"
    threads = cpu_threads_per_rank(nprocs)
    if threads > 1:
        return (f"each rank gets {threads} CPU threads, and a process forked after OpenMP's threads ran hangs in "
                f"its first multi-threaded op (OMP_NUM_THREADS=1 lets ranks start by fork)")
    return None


def _cuda_in_use() -> bool:
    in_bad_fork = getattr(torch.cuda, "_is_in_bad_fork", None)
    return bool(torch.cuda.is_initialized() or (callable(in_bad_fork) and in_bad_fork()))


class ForkedRanks(WorkerPool):
    """Ranks 1..`nprocs`-1 forked now with `work` (the caller's own objects) as their first stage,
    which `run_stage` runs with this process as rank 0; afterwards they serve as a pool's workers
    (`run`, the work pickled) until closed."""

    def __init__(self, nprocs: int, work: Work, restart_count: int, notice_signals: tuple[str, ...],
                 group_generation: int) -> None:
        self._work = work
        self._order = Order("", {}, os.getcwd(), restart_count, notice_signals, group_generation)
        self._collects_garbage = gc.isenabled()  # the forked ranks collect as this process did
        with _quiet_fork():
            super().__init__(nprocs, "fork")

    def _entry(self, spec: WorkerSpec, connection: Connection) -> tuple[Callable[..., None], tuple[Any, ...]]:
        return forked_rank_main, (spec, connection, self._order, self._work, self._collects_garbage)

    def run_stage(self, run_here: Callable[[], T]) -> T:
        """Run rank 0's part here while the forked ranks run theirs (they started at the fork)."""
        return self._run_stage(lambda: None, run_here)


@contextlib.contextmanager
def _quiet_fork() -> Iterator[None]:
    """Fork with nothing pending: stdio flushed (a child would print the parent's buffered output
    again) and Python's warning about forking a threaded process silenced (a rank uses only what
    was its own at the fork: the objects of the stage, and the group it makes).

    Garbage collection is off across the fork, and a forked rank freezes what it inherited before it
    turns collection back on (strategies/worker.py): this process's garbage (an earlier Trainer, a
    destroyed group and the pool's store it used) holds objects whose C++ destructors join threads
    that only this process has, so freeing one in the rank would wait forever, and the rank would
    never reach its group's first barrier."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
            yield
    finally:
        if collecting:
            gc.enable()
