"""What runs inside one local rank 1..N-1: a pool's worker takes stages from the launching process,
one after the other, until told to stop or until the launching process is gone; a rank forked for
one stage runs it on the objects it inherited and ends.

A pool's worker is started once per `WorkerPool` (strategies/worker_pool.py), which every Trainer of
the process with the same world size and device kind shares; it keeps its process group between
stages (made again when the order says the group changed: another backend or timeout), so
`trainer.test()` after `trainer.fit()`, or a second Trainer, starts no process. Each stage arrives as
an `Order` over the worker's pipe; the work itself (often a whole model and its data) is in a file
the order names. A failure is stamped into the failures folder (the launching process reads the
stamps to name the root cause) and ends the process.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle
import torch

from strategies import process_group
from strategies.environment import GROUP_GENERATION_VARIABLE, LOCAL_LAUNCH_MARKER
from strategies.hang_guard import FAILURES_DIR_VARIABLE, write_failure_stamp
from strategies.notice_signals import forget_held_notices, hold_notices
from strategies.preemption import Preempted

if TYPE_CHECKING:
    from strategies.base import Strategy

# The signals a stop from outside arrives as (torch elastic and torchrun use the same set).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
                     if hasattr(signal, name))
# After the launching process died and this worker was interrupted, how long it may take to
# wind down before it ends itself: a rank blocked in a collective never sees the interrupt.
_ORPHAN_GRACE_S = 10.0
_LARGE_PAYLOAD_BYTES = 64 * 1024 * 1024  # a stage whose work is this large is collected as it ends


@dataclass(frozen=True)
class WorkerSpec:
    """Who a worker is, fixed for its life."""

    local_rank: int
    world_size: int
    store_port: int  # the launching process's TCPStore: the group's rendezvous
    failures_dir: str
    start_method: str
    user_start_method: str | None = None  # the launching process's choice for processes a rank starts


@dataclass(frozen=True)
class Order:
    """One stage for a worker: the work's file and what the launching process's state is now
    (environment variables changed since the pool started, working directory), so that a
    stage sees what a freshly started worker would (a seed set between fit and test)."""

    payload_path: str
    env_changes: dict[str, str | None]
    cwd: str
    restart_count: int = 0
    notice_signals: tuple[str, ...] = ()  # the strategy's preemption signals, held from the stage's start
    group_generation: int = 0  # which process group of the pool the stage runs in (a new one: made again)


STOP = "stop"  # the message that ends a worker's loop


def worker_main(spec: WorkerSpec, connection: Connection) -> None:
    """Entry point of every local worker of a pool (module level, so a spawned process imports it by name)."""
    become_rank(spec)
    gc.freeze()  # torch, imported by now, is never garbage: Python's collections need not scan it
    _serve(spec, connection)


def forked_rank_main(spec: WorkerSpec, connection: Connection, order: Order,
                     work: tuple[Strategy, Any, tuple[Any, ...], dict[str, Any]], collect_garbage: bool) -> None:
    """Entry point of a rank forked from the launching process (strategies/forked_ranks.py): its first
    stage is `work`, the caller's own objects inherited by the fork, so nothing was pickled. Then it
    serves later stages as a pool's worker does (their work pickled), until told to stop; multiprocessing
    ends a forked process with `os._exit`, so the caller's exit handlers never run here."""
    # Never collect what was inherited (the fork happened with collection off): the launching process's
    # garbage holds stores and groups whose destructors would wait here forever for its threads.
    gc.freeze()
    if collect_garbage:
        gc.enable()
    become_rank(spec)
    _draw_from_fresh_entropy()
    try:
        _prepare_stage(order)
        answer = run_work(*work)
        del work
        connection.send_bytes(answer)
    except BaseException:
        _stamp_and_exit(spec)
    _serve(spec, connection)


def _serve(spec: WorkerSpec, connection: Connection) -> None:
    """Run the stages the launching process sends, until it says stop or goes away."""
    try:
        while (order := _next_order(connection)) is not None:
            large = os.path.getsize(order.payload_path) >= _LARGE_PAYLOAD_BYTES  # gone once answered
            connection.send_bytes(_run_order(order))
            if large:
                _free_the_stage()
    except BaseException:
        _stamp_and_exit(spec)
    finally:
        exiting()
        # Only a spawned worker's interpreter is torn down at exit (where leftovers of the group would
        # abort it); a forked one ends with os._exit, and a full collection of a forked rank's inherited
        # heap would keep the launching process waiting for most of a second.
        process_group.destroy_process_group(collect_garbage=spec.start_method == "spawn")


def become_rank(spec: WorkerSpec) -> None:
    """What makes a new process one of our local ranks, however it started."""
    # A terminal's Ctrl-C goes to its foreground process group: rank 0 (the launching process) takes
    # it, shuts down gracefully and stops the workers; a worker interrupted on its own would leave
    # rank 0 waiting for it in a collective.
    os.setpgrp()
    obey_stop_signals()
    stop_when_the_launcher_dies()
    _export_rank_variables(spec)
    # A rank killed by a C++ abort (gloo on mismatched collectives) leaves its Python stack here.
    faulthandler.enable(file=open(Path(spec.failures_dir, f"{spec.local_rank}.fault"), "w"))  # noqa: SIM115
    split_cpu_threads(spec.world_size)
    # A DataLoader's workers inside this rank start as the user's would in the launching process
    # (the platform's default unless the user chose), not as this process was started: multiprocessing
    # makes a child's default the method that started it (fork, forkserver or spawn).
    multiprocessing.set_start_method(spec.user_start_method, force=True)


def _draw_from_fresh_entropy() -> None:
    """A forked rank's unseeded numpy draws are its own, as a started rank's are (and as Python's
    `random` reseeds itself at a fork): otherwise it would repeat, draw for draw, the stream it
    inherited from rank 0 (the same augmentation on every rank). A seeded script is unaffected: each
    stage seeds every rank again from `PL_GLOBAL_SEED` (trainer/seed.py `reset_seed`)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _stamp_and_exit(spec: WorkerSpec) -> None:
    """Stamp the failure with a precise time before the process exits: the peers' errors that this
    exit causes come later, so the earliest stamp is the root cause."""
    write_failure_stamp(Path(spec.failures_dir), traceback.format_exc())
    sys.exit(1)  # quietly: the launching process reports the stamped traceback once


def exiting() -> None:
    """Say that this interpreter is exiting before our exit-time clean-up runs. Destroying the process
    group collects garbage, which shuts down DataLoader iterators still alive (persistent workers); torch
    skips waiting for their workers once it knows the interpreter is exiting, but it learns that from an
    exit hook that runs after ours, so each shutdown waited for its workers, seconds each."""
    from torch.utils.data import _utils as loader_utils

    loader_utils.python_exit_status = True


def _free_the_stage() -> None:
    """After answering, collect what a stage with a large payload left (a module and its trainer
    refer to each other, so its weights would otherwise wait for Python's next full collection and
    the next stage's copy would come on top). A small one is left to Python's own collections: a
    full collection scans every object torch made, 0.2-0.4 s on a small CPU, which a quick next stage
    (test after fit) would wait for. What survives is frozen, so later collections skip it."""
    gc.collect()
    gc.freeze()


def _next_order(connection: Connection) -> Order | None:
    """The next stage, or None when the launching process says stop or has gone away."""
    try:
        message = pickle.loads(connection.recv_bytes())
    except (EOFError, OSError):
        return None
    return None if message == STOP else message  # type: ignore[no-any-return]


def _run_order(order: Order) -> bytes:
    """Run one stage of a pool's worker and answer that it is done (rank 0, the launching process,
    has the result)."""
    _prepare_stage(order)
    return run_work(*load_work(order.payload_path))


def _prepare_stage(order: Order) -> None:
    """The launching process's state for the stage, its preemption signals held from now on (a
    forwarded notice never kills this worker), and its process group: a new one when the order says so
    (another Trainer's backend or timeout, or rank 0 left)."""
    _apply_launcher_state(order)
    hold_notices(order.notice_signals)
    forget_held_notices()
    if order.group_generation != _Group.generation:
        process_group.destroy_process_group()
        _Group.generation = order.group_generation


def run_work(strategy: Strategy, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Join the group, run the stage, leave it with the other ranks. A stage that every rank left
    preempted, after its checkpoint, is done too."""
    strategy.setup_environment()
    try:
        fn(*args, **kwargs)
    except Preempted:
        pass
    finish(strategy)
    return b"done"


class _Group:
    """Which of the pool's process groups this worker holds (the launching process numbers them)."""

    generation = 0


def _apply_launcher_state(order: Order) -> None:
    for key, value in order.env_changes.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(order.restart_count)
    os.environ[GROUP_GENERATION_VARIABLE] = str(order.group_generation)
    if os.getcwd() != order.cwd:
        os.chdir(order.cwd)


def _export_rank_variables(spec: WorkerSpec) -> None:
    """The variables torchrun sets, so one code path reads ranks the same way everywhere;
    `TORCHELASTIC_USE_AGENT_STORE` points every rank at the launching process's store."""
    os.environ.update({
        LOCAL_LAUNCH_MARKER: "1", FAILURES_DIR_VARIABLE: spec.failures_dir,
        "RANK": str(spec.local_rank), "LOCAL_RANK": str(spec.local_rank), "GROUP_RANK": "0",
        "WORLD_SIZE": str(spec.world_size), "LOCAL_WORLD_SIZE": str(spec.world_size),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(spec.store_port),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
    })


def load_work(path: str) -> tuple[Strategy, Any, tuple[Any, ...], dict[str, Any]]:
    """Load the launching process's work. Storages are mapped copy-on-write (private to this rank).

    `weights_only=False`: the file is the launching process's own pickle of the function and its
    arguments, written a moment ago into a private temporary directory, not a checkpoint.
    """
    work: tuple[Strategy, Any, tuple[Any, ...], dict[str, Any]] = torch.load(path, mmap=True, weights_only=False)
    return work


def finish(strategy: Strategy) -> None:
    """Wait for every rank before tearing down: a rank that closed its connections while a peer
    was still reading the last collective would break that peer."""
    strategy.barrier("teardown")
    strategy.teardown()


def split_cpu_threads(local_world_size: int) -> None:
    """Give each local rank its share of the CPUs, so N ranks do not oversubscribe N x cores."""
    threads = cpu_threads_per_rank(local_world_size)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def cpu_threads_per_rank(local_world_size: int) -> int:
    """A local rank's share of the CPUs, unless the user decided (OMP_NUM_THREADS)."""
    if "OMP_NUM_THREADS" in os.environ:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // max(1, local_world_size))


def obey_stop_signals() -> None:
    """Let the stop signals stop this worker even where the launching process ignores them.

    A worker inherits ignored signals (a forked one the server's, a spawned one across exec):
    under a background job SIGINT and SIGQUIT are ignored, so a stop would have to wait out the
    grace period and SIGKILL. Only ignored signals are reset: a handler the user's script
    installed at import stays.
    """
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


def stop_when_the_launcher_dies() -> None:
    """Interrupt this worker once the launching process is gone (its end of a pipe closes), and
    end it outright if it has not wound down after a grace period."""
    launcher = multiprocessing.parent_process()
    if launcher is None:
        return

    def watch() -> None:
        wait([launcher.sentinel])
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(_ORPHAN_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="ddp-trainer-launcher-watch", daemon=True).start()
