"""Run a function on every rank: in this process alone when the ranks already exist (torchrun,
srun) or there is only one; else this process is global rank 0, as in Lightning's `ddp`, and
ranks 1..N-1 are local processes.

Rank 0 running in the calling process means the objects the user holds (module, callbacks,
loggers, trainer) are the ones that ran: nothing comes back, nothing is copied. Ranks 1..N-1 live
in one of two ways, chosen per stage:

* Forked from the caller (strategies/forked_ranks.py) where that is safe (a platform with fork, no
  CUDA, one CPU thread per rank): the ranks inherit the caller's objects, as under Lightning's
  `ddp_notebook`, so nothing is pickled and nothing imported again. They then stay, with their
  group, as the process's pool: a later stage whose work pickles goes to them, one whose work does
  not (a lock, a socket, a generator in it) is forked afresh.
* Else a worker pool (strategies/worker_pool.py) started from a forkserver (or spawned), which
  receives a pickled copy of the work at each stage's start.

The pool belongs to the process, not to one strategy: every Trainer with the same world size, device
kind and start method reaches the same ranks, and their process group is made again only when what it
depends on changes (backend, timeout; the world size and the store's address change with the pool).
Two Trainers with different world sizes or devices get different pools (the old one stops first), so
they never share a group.

Either way one stage runs at a time; a rank's failure ends them all and raises `WorkerFailedError`
naming the rank (rank 0's own exception goes on as it is, after the others are stopped); this
process survives either, and the next stage starts fresh. With `max_restarts=K` the same work runs
again on fresh ranks, up to K times; every rank, this one included, sees the attempt's number
(`TORCHELASTIC_RESTART_COUNT`, `strategy.restart_count`) and a fit resumes from its newest
checkpoint. Restarts default to 0: a restart would silently mask a crash. Nothing outlives the
process: the pool stops at exit, and its workers stop by themselves if this process is killed.

On the pool, the work travels by value where it must: `cloudpickle` serialises classes and
functions defined in `__main__`, inside functions or in a notebook, which workers could not import.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import inspect
import os
import pickle
import signal
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle
import torch

from strategies import cell_sources, process_group
from strategies.environment import LaunchingProcessEnvironment, use_launching_process_rank
from strategies.forked_ranks import ForkedRanks, fork_blocker
from strategies.hang_guard import LEDGER
from strategies.notice_signals import replace_handlers
from strategies.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionPolicy
from strategies.unpicklable import unpicklable_paths
from strategies.worker import cpu_threads_per_rank, exiting, finish
from strategies.worker_failure import WorkerFailedError
from strategies.worker_pool import WorkerPool

if TYPE_CHECKING:
    from strategies.base import Strategy

__all__ = ["WorkerFailedError", "launch", "stop_workers"]

RESTART_COUNT_VARIABLE = "TORCHELASTIC_RESTART_COUNT"


class _SharedPool:
    """The one worker pool this process keeps, what it was started for, and the group its ranks hold."""

    pool: WorkerPool | None = None
    key: tuple[Any, ...] | None = None  # (world size, device kind, start method)
    group: tuple[Any, ...] | None = None  # the options of the group its ranks hold now; None: none
    generation = 0  # numbers the pool's groups: a new group meets under new keys of the same store
    users: list[weakref.ReferenceType[Any]] = []  # the strategies that ran a stage on it
    stage_lock = threading.Lock()  # one stage at a time, in any thread
    collect_at_exit = False  # a forked stage's group left garbage that must go before the interpreter does


def launch(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
           nprocs: int, in_place: bool, max_restarts: int = 0, start_method: str = "forkserver",
           device_kind: str = "cpu", group: tuple[Any, ...] = ()) -> Any:
    """Run `fn(*args, **kwargs)` on every rank and return global rank 0's result.

    `in_place` means this process already is the only rank of its own (torchrun/srun, or a world
    of one). Otherwise this process is global rank 0, running `fn` on the objects it was given, and
    ranks 1..`nprocs`-1 are forked for the stage or served by the process's pool (workers started
    with `start_method`, "forkserver" where possible, or "spawn"). `group` is what the process
    group depends on besides the world size (backend, timeout): a pool's group is made again when
    it changes.
    """
    if in_place:
        _leave_pool_group()  # the pool's group would be in the way; its workers stay for later stages
        return run_here(strategy, fn, args, kwargs)
    if not _SharedPool.stage_lock.acquire(blocking=False):
        raise RuntimeError("launch() was called while another stage runs on this process's ranks (a Trainer's fit "
                           "inside another's hook, or from another thread): ranks serve one Trainer at a time. "
                           "Run the stages one after the other.")
    try:
        blocker = fork_blocker(nprocs, start_method, device_kind)
        key = (nprocs, device_kind, "fork" if blocker is None else start_method)
        with tempfile.TemporaryDirectory(prefix="ddp-trainer-stage-") as stage_dir:
            payload_path = Path(stage_dir, "payload.pt")
            if blocker is not None:
                _serialize(strategy, fn, args, kwargs, payload_path, why_not_forked=blocker)  # before rank 0 runs
            pooled = blocker is not None or (_live_pool(key) and _pickles(strategy, fn, args, kwargs, payload_path))

            def start(restart: int) -> _Stage:
                if pooled and (blocker is not None or _live_pool(key)):
                    return _pool_stage(strategy, payload_path, key, group, restart)
                return _forked_stage(strategy, (strategy, fn, args, kwargs), key, group, restart)

            return _attempts(strategy, fn, args, kwargs, max_restarts, start)
    finally:
        _SharedPool.stage_lock.release()


@dataclass
class _Stage:
    """One attempt's ranks 1..N-1, how to run it, and what follows its end."""

    ranks: WorkerPool
    run: Callable[[Callable[[], Any]], Any]
    generation: int = 0


def _forked_stage(strategy: Strategy, work: Any, key: tuple[Any, ...], group: tuple[Any, ...],
                  restart: int) -> _Stage:
    """Fork ranks 1.. with the caller's objects as their first stage; they become the process's pool."""
    stop_workers(collect_garbage=False)  # the old pool's group must not be inherited by the forked ranks
    generation = _SharedPool.generation + 1
    ranks = ForkedRanks(key[0], work, restart, strategy.preemption.signals, generation)
    _SharedPool.pool, _SharedPool.key, _SharedPool.group, _SharedPool.generation = ranks, key, group, generation
    _remember_user(strategy)
    return _Stage(ranks, ranks.run_stage, generation)


def _live_pool(key: tuple[Any, ...]) -> bool:
    pool = _SharedPool.pool
    return pool is not None and _SharedPool.key == key and pool.alive


def _remember_user(strategy: Strategy) -> None:
    _SharedPool.users = [user for user in _SharedPool.users if user() is not None and user() is not strategy]
    _SharedPool.users.append(weakref.ref(strategy))


def _pool_stage(strategy: Strategy, payload_path: Path, key: tuple[Any, ...], group: tuple[Any, ...],
                restart: int) -> _Stage:
    pool = _pool_for(key)
    # Another Trainer's backend or timeout, or this process's end of the group was destroyed between the
    # stages (torch.distributed.destroy_process_group() by the user or a test harness): the ranks make a new one.
    if _SharedPool.group != group or not torch.distributed.is_initialized():
        process_group.destroy_process_group()
        _SharedPool.group, _SharedPool.generation = group, _SharedPool.generation + 1
    _remember_user(strategy)
    generation, signals = _SharedPool.generation, strategy.preemption.signals

    def run(work_here: Callable[[], Any]) -> Any:
        return pool.run(str(payload_path), work_here, restart_count=restart, notice_signals=signals,
                        group_generation=generation)

    return _Stage(pool, run, generation)


def _attempts(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              max_restarts: int, start: Callable[[int], _Stage]) -> Any:
    """Run the stage on fresh ranks up to `max_restarts` + 1 times: until it succeeds, rank 0 raises
    on its own, or a failure or preemption may not be restarted."""
    for restart in range(max_restarts + 1):
        stage = start(restart)
        policy = strategy.preemption
        try:
            with forward_notices(stage.ranks, policy) as notice, \
                    _rank_zero_of(stage.ranks, restart, stage.generation):
                result = stage.run(lambda: _preempted_as_result(strategy, fn, args, kwargs))
        except WorkerFailedError as failure:
            _forget_pool(stage.ranks)  # the ranks closed themselves
            _after_failure(failure, notice, last_attempt=restart == max_restarts)
            warnings.warn(f"restarting the workers ({restart + 1} of {max_restarts}) after: {failure}",
                          RuntimeWarning, stacklevel=3)
            continue
        except BaseException:
            _forget_pool(stage.ranks)  # rank 0's own error (or Ctrl-C): the ranks closed themselves
            raise
        if isinstance(result, Preempted):
            # A notice to this process (rank 0 caught it itself, or it came outside the fit) means
            # the whole job is going away: no restart then.
            if notice.received or result.received_here or restart == max_restarts:
                raise result  # exit 75 unless the script catches it
            warnings.warn(f"restarting the workers ({restart + 1} of {max_restarts}) after a worker was {result}",
                          RuntimeWarning, stacklevel=3)
            continue
        if notice.received:  # after the last step boundary, or in a stage without training: nothing to stop
            warnings.warn(f"{notice.received} (a preemption notice) came while the stage was ending or had no "
                          "training to checkpoint; the stage completed and the script goes on until the "
                          "scheduler stops it.", RuntimeWarning, stacklevel=3)
        return result
    raise AssertionError("unreachable: the last attempt returns or raises")


def run_here(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """This process's rank: join the group, run the work, and leave together with the other ranks
    (a preempted stage too: every rank stops after the same step). On a failure nothing waits for
    the peers, and what the stage attached here (the reducer's hooks on the user's module, the hang
    guard) is released: this process lives on (a notebook, a test, the caller's script)."""
    strategy.setup_environment()
    try:
        result = fn(*args, **kwargs)
    except Preempted:
        finish(strategy)
        raise
    except BaseException:
        strategy.teardown()
        raise
    finish(strategy)
    return result


def _preempted_as_result(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
    try:
        return run_here(strategy, fn, args, kwargs)
    except Preempted as notice:  # the stage ended together on every rank: the pool stays usable
        return notice


@contextlib.contextmanager
def _rank_zero_of(ranks: WorkerPool, restart: int, generation: int) -> Iterator[None]:
    """For one stage, this process is global rank 0 of `ranks`: its environment says so (the
    strategy keeps it afterwards, for the ranks the user reads), it sees the attempt's number as
    every other rank does (`TORCHELASTIC_RESTART_COUNT`, for the attempt only), it takes its share
    of the CPUs, and a hang-guard verdict here ends the stage (the other ranks are killed, the stage
    raises) instead of the process."""
    environment = LaunchingProcessEnvironment(ranks.nprocs, ranks.store, restart, generation)
    use_launching_process_rank(environment)
    threads = torch.get_num_threads()
    torch.set_num_threads(cpu_threads_per_rank(ranks.nprocs))
    restart_count_before = os.environ.get(RESTART_COUNT_VARIABLE)
    os.environ[RESTART_COUNT_VARIABLE] = str(restart)
    LEDGER.end_stage = lambda message: ranks.fail_stage(0, message)
    try:
        yield
    finally:
        LEDGER.end_stage = None
        _restore_variable(RESTART_COUNT_VARIABLE, restart_count_before)
        environment.end_stage()
        use_launching_process_rank(None)
        torch.set_num_threads(threads)


def _restore_variable(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


class _Notice:
    received: str | None = None


def _after_failure(failure: WorkerFailedError, notice: _Notice, last_attempt: bool) -> None:
    """Raise what a failed stage ends as; return when the workers should be restarted. With a notice
    to the launching process the job is going away: no restart. A worker that ended with the preemption
    code ran out of its grace period before a checkpoint."""
    if notice.received:
        raise Preempted(None, notice.received, None) from failure
    if last_attempt and failure.exitcode == PREEMPTED_EXIT_CODE:
        raise Preempted(None, "a preemption signal", None) from failure
    if last_attempt:
        raise failure


@contextlib.contextmanager
def forward_notices(pool: WorkerPool, policy: PreemptionPolicy) -> Iterator[_Notice]:
    """While a stage runs, a preemption signal to the launching process (Kubernetes and most
    schedulers signal only the main process) goes on to every worker, which checkpoint and stop
    together; the launching process then exits with the preemption code instead of dying at once."""
    notice = _Notice()

    def forward(signum: int, frame: Any) -> None:
        if notice.received is None:
            notice.received = signal.Signals(signum).name
        pool.notify(signum)

    restore = replace_handlers(policy.signals, forward)
    try:
        yield notice
    finally:
        restore()


def stop_workers(strategy: Strategy | None = None, collect_garbage: bool = True) -> None:
    """Stop the process's worker pool (when `strategy` is given: only if it ran a stage there);
    nothing happens if there is none. This process stops being rank 0 of it: its end of the process
    group goes too. The next stage starts a fresh pool."""
    pool = _SharedPool.pool
    if pool is None or (strategy is not None and not any(user() is strategy for user in _SharedPool.users)):
        return
    _forget_pool(pool, collect_garbage)  # this process's end of the group first: a worker never waits on it
    pool.close()


def _forget_pool(ranks: WorkerPool | None = None, collect_garbage: bool = True) -> None:
    """No pool any more (when `ranks` is the pool, or always when None): this process holds no group
    with it. Without `collect_garbage` the group's leftovers are collected at exit instead (a full
    collection takes most of a second in a process that imported torch)."""
    if ranks is None or ranks is _SharedPool.pool:
        _SharedPool.pool = _SharedPool.key = _SharedPool.group = None
        _SharedPool.users = []
    process_group.abort_or_destroy(collect_garbage)
    _SharedPool.collect_at_exit |= not collect_garbage


def _leave_pool_group() -> None:
    """A world of one runs here: this process leaves the pool's group (the workers keep theirs until
    their next stage, which makes a new one)."""
    if _SharedPool.pool is not None and _SharedPool.group is not None:
        process_group.destroy_process_group()
        _SharedPool.group = None


def _pool_for(key: tuple[Any, ...]) -> WorkerPool:
    """The process's live pool if it was started for `key` (world size, device kind, start method),
    else a new one (stopping the other first: its workers and group fit another shape)."""
    pool = _SharedPool.pool
    if pool is not None and _SharedPool.key == key and pool.alive:
        return pool
    stop_workers()
    nprocs, _, start_method = key
    pool = WorkerPool(nprocs, start_method)  # ranks 1..nprocs-1; this process is rank 0
    _SharedPool.pool, _SharedPool.key, _SharedPool.group = pool, key, None
    return pool


def _at_exit() -> None:
    exiting()
    stop_workers()
    if _SharedPool.collect_at_exit:
        gc.collect()


atexit.register(_at_exit)  # after multiprocessing's own exit hook was registered: runs before it


def _pickles(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             path: Path) -> bool:
    """Whether the work could be written to `path` for a pool (where forking is the alternative)."""
    try:
        _serialize(strategy, fn, args, kwargs, path, diagnose=False)
    except TypeError:
        path.unlink(missing_ok=True)
        return False
    return True


def _serialize(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               path: Path, why_not_forked: str = "", diagnose: bool = True) -> None:
    """Save the work to `path` with `torch.save`, in one piece.

    Every worker loads its own private copy of each tensor: torch.multiprocessing, which spawn
    would otherwise use, moves CPU tensors to shared memory, so N ranks would step the *same*
    parameters N times. One piece keeps shared references (the strategy inside `fn`'s arguments
    is the strategy the worker sets up). `cloudpickle` serialises by value what a worker could not
    import by name (classes and functions from `__main__`, a notebook or a function's body), and by
    reference everything else. `torch.save` rather than plain pickle so that workers can
    map tensor storages from the file instead of materialising every tensor twice (bytes, then
    storage) while unpickling: that transient copy was the largest part of a rank's peak memory.
    When something cannot be pickled, the error names every such object with its path.
    """
    try:
        torch.save((strategy, fn, args, kwargs), path, pickle_module=cell_sources,
                   pickle_protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # noqa: BLE001 - whatever a user's __getstate__ or __reduce__ raises
        if not diagnose:
            raise TypeError(str(error)) from error
        raise _unpicklable_work_error(fn, args, kwargs, error, why_not_forked) from error


def _unpicklable_work_error(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                            error: Exception, why_not_forked: str) -> TypeError:
    name = getattr(fn, "__qualname__", None) or repr(fn)
    culprits = unpicklable_paths(_named_arguments(fn, args, kwargs))
    which = f"These cannot: {', '.join(culprits)}." if culprits else f"({type(error).__name__}: {error})."
    not_forked = f" Ranks were not forked from this process because {why_not_forked}." if why_not_forked else ""
    return TypeError(f"launch() runs {name} on ranks 1..N-1 in worker processes, which receive a pickled copy of "
                     f"it and its arguments; something in them cannot be pickled (an open file, a lock, a generator, "
                     f"a live connection). {which}{not_forked} Create such an object inside a hook (setup, "
                     f"configure_model, on_fit_start) instead of in __init__, or leave it out of the object's "
                     f"pickled state (__getstate__).")


def _named_arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        return dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return {f"argument {index}": arg for index, arg in enumerate(args)} | kwargs
