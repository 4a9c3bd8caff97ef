"""Run a function on every rank: in this process alone when the ranks already exist (torchrun,
srun) or there is only one; else this process is global rank 0, as in Lightning's `ddp`, and
ranks 1..N-1 are local workers that live across stages.

Rank 0 running in the calling process means the objects the user holds (module, callbacks,
loggers, trainer) are the ones that ran: nothing comes back, nothing is copied. The workers get a
copy of the work at each stage's start. The first launch of a strategy starts its `WorkerPool`
(strategies/worker_pool.py); later launches of the same strategy (validate, test or predict after
fit) reuse those workers and this process's end of their process group. A process keeps at most
one pool: a launch by another strategy stops the previous one. A worker's failure ends the pool
and raises `WorkerFailedError` naming the rank (rank 0's own exception goes on as it is, after the
workers are stopped); this process survives either and the next stage starts a fresh pool. With
`max_restarts=K` a fresh pool runs the same work again, up to K times (the restarted stage sees
`restart_count` > 0, and a fit resumes from its newest checkpoint). Restarts default to 0: a
restart would silently mask a crash.

The work travels by value where it must: `cloudpickle` serialises classes and functions
defined in `__main__`, inside functions or in a notebook, which workers could not import.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import pickle
import signal
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle
import torch

from strategies import process_group
from strategies.environment import LaunchingProcessEnvironment, use_launching_process_rank
from strategies.hang_guard import LEDGER
from strategies.notice_signals import replace_handlers
from strategies.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionPolicy
from strategies.worker import cpu_threads_per_rank, exiting, finish
from strategies.worker_failure import WorkerFailedError
from strategies.worker_pool import WorkerPool

if TYPE_CHECKING:
    from strategies.base import Strategy

__all__ = ["WorkerFailedError", "launch", "stop_workers"]


class _ActivePool:
    """The one pool this process keeps, and a weak reference to the strategy it belongs to."""

    pool: WorkerPool | None = None
    owner: weakref.ReferenceType[Any] | None = None


def launch(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
           nprocs: int, in_place: bool, max_restarts: int = 0, start_method: str = "forkserver") -> Any:
    """Run `fn(*args, **kwargs)` on every rank and return global rank 0's result.

    `in_place` means this process already is the only rank of its own (torchrun/srun, or a world
    of one). Otherwise this process is global rank 0, running `fn` on the objects it was given, and
    ranks 1..`nprocs`-1 run on copies in local workers started with `start_method` ("forkserver"
    where possible, or "spawn").
    """
    if in_place:
        stop_workers()  # another strategy's workers, and this process's end of their group, would be in the way
        return run_here(strategy, fn, args, kwargs)
    with tempfile.TemporaryDirectory(prefix="ddp-trainer-stage-") as stage_dir:
        payload_path = Path(stage_dir, "payload.pt")
        _serialize(strategy, fn, args, kwargs, payload_path)  # before rank 0 changes anything
        for restart in range(max_restarts + 1):
            pool = _pool_for(strategy, nprocs, start_method)
            policy = strategy.preemption
            try:
                with forward_notices(pool, policy) as notice, _rank_zero_of(pool, restart):
                    result = pool.run(str(payload_path), lambda: _preempted_as_result(strategy, fn, args, kwargs),
                                      restart_count=restart, notice_signals=policy.signals)
            except WorkerFailedError as failure:
                _forget_pool()  # the pool closed itself
                _after_failure(failure, notice, last_attempt=restart == max_restarts)
                warnings.warn(f"restarting the workers ({restart + 1} of {max_restarts}) after: {failure}",
                              RuntimeWarning, stacklevel=2)
                continue
            except BaseException:
                _forget_pool()  # rank 0's own error (or Ctrl-C): the pool closed itself
                raise
            if isinstance(result, Preempted):
                # A notice to this process (rank 0 caught it itself, or it came outside the fit) means
                # the whole job is going away: no restart then.
                if notice.received or result.received_here or restart == max_restarts:
                    raise result  # exit 75 unless the script catches it
                warnings.warn(f"restarting the workers ({restart + 1} of {max_restarts}) after a worker was {result}",
                              RuntimeWarning, stacklevel=2)
                continue
            if notice.received:  # after the last step boundary, or in a stage without training: nothing to stop
                warnings.warn(f"{notice.received} (a preemption notice) came while the stage was ending or had no "
                              "training to checkpoint; the stage completed and the script goes on until the "
                              "scheduler stops it.", RuntimeWarning, stacklevel=2)
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
def _rank_zero_of(pool: WorkerPool, restart: int) -> Iterator[None]:
    """For one stage, this process is global rank 0 of `pool`: its environment says so (nothing is
    written to `os.environ`; the strategy keeps it afterwards, for the ranks the user reads), it takes
    its share of the CPUs, and a hang-guard verdict here ends the stage (the workers are killed, the
    stage raises) instead of the process."""
    use_launching_process_rank(LaunchingProcessEnvironment(pool.nprocs, pool.store, restart))
    threads = torch.get_num_threads()
    torch.set_num_threads(cpu_threads_per_rank(pool.nprocs))
    LEDGER.end_stage = lambda message: pool.fail_stage(0, message)
    try:
        yield
    finally:
        LEDGER.end_stage = None
        use_launching_process_rank(None)
        torch.set_num_threads(threads)


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


def stop_workers(strategy: Strategy | None = None) -> None:
    """Stop the pool kept for `strategy` (any pool when None); nothing happens if there is none.
    This process stops being rank 0 of it: its end of the process group goes too."""
    pool, owner = _ActivePool.pool, _ActivePool.owner
    if pool is None or (strategy is not None and (owner is None or owner() is not strategy)):
        return
    _forget_pool()  # this process's end of the group first: a worker never waits on it while idle
    pool.close()


def _forget_pool() -> None:
    """No pool any more: this process holds no group with it."""
    _ActivePool.pool = _ActivePool.owner = None
    process_group.abort_or_destroy()


def _pool_for(strategy: Strategy, nprocs: int, start_method: str) -> WorkerPool:
    """The strategy's live pool, or a new one (stopping another strategy's pool first)."""
    pool, owner = _ActivePool.pool, _ActivePool.owner
    same = (pool is not None and owner is not None and owner() is strategy and pool.nprocs == nprocs
            and pool.requested_start_method == start_method and pool.alive)
    if same:
        return pool  # type: ignore[return-value]
    stop_workers()
    pool = WorkerPool(nprocs, start_method)  # ranks 1..nprocs-1; this process is rank 0
    _ActivePool.pool, _ActivePool.owner = pool, weakref.ref(strategy, _owner_gone)
    return pool


def _owner_gone(_: Any) -> None:
    """The strategy was garbage-collected: nobody can send its workers another stage."""
    stop_workers()


def _at_exit() -> None:
    exiting()
    stop_workers()


atexit.register(_at_exit)  # after multiprocessing's own exit hook was registered: runs before it


def _serialize(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               path: Path) -> None:
    """Save the work to `path` with `torch.save`, in one piece.

    Every worker loads its own private copy of each tensor: torch.multiprocessing, which spawn
    would otherwise use, moves CPU tensors to shared memory, so N ranks would step the *same*
    parameters N times. One piece keeps shared references (the strategy inside `fn`'s arguments
    is the strategy the worker sets up). `cloudpickle` serialises by value what a worker could not
    import by name (classes and functions from `__main__`, a notebook or a function's body), and by
    reference everything else. `torch.save` rather than plain pickle so that workers can
    map tensor storages from the file instead of materialising every tensor twice (bytes, then
    storage) while unpickling: that transient copy was the largest part of a rank's peak memory.
    """
    try:
        torch.save((strategy, fn, args, kwargs), path, pickle_module=cloudpickle,
                   pickle_protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        name = getattr(fn, "__qualname__", None) or repr(fn)
        culprit = unpicklable_part(_named_arguments(fn, args, kwargs))
        where = f" The first that cannot: {culprit}." if culprit else ""
        raise TypeError(f"launch() runs {name} on ranks 1..N-1 in worker processes, which receive a pickled copy "
                        f"of it and its arguments; something in them cannot be pickled (an open file, a lock, a "
                        f"generator, a live connection): {error}.{where} Create such an object inside a hook "
                        f"(setup, configure_model, on_fit_start) instead of in __init__, or leave it out of the "
                        f"object's pickled state (__getstate__).") from error


def _named_arguments(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        return dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return {f"argument {index}": arg for index, arg in enumerate(args)} | kwargs


def unpicklable_part(named: dict[str, Any], depth: int = 4) -> str | None:
    """The path of the innermost part of `named`'s values that cannot be pickled ("argument 2 ->
    .callbacks[1] -> .handle (TextIOWrapper)"), or None; only runs once pickling already failed."""
    for label, value in named.items():
        if _pickles(value):
            continue
        inner = unpicklable_part(_parts(value), depth - 1) if depth > 0 else None
        return f"{label} -> {inner}" if inner else f"{label} ({type(value).__name__})"
    return None


def _pickles(value: Any) -> bool:
    try:
        cloudpickle.dumps(value)
    except Exception:  # noqa: BLE001 (any failure means: this part cannot travel)
        return False
    return True


def _parts(value: Any) -> dict[str, Any]:
    """What `value` pickles: its items, or its attributes (as its __getstate__ gives them)."""
    if isinstance(value, dict):
        return {f"[{key!r}]": item for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return {f"[{index}]": item for index, item in enumerate(value)}
    state = value.__getstate__() if hasattr(value, "__getstate__") else getattr(value, "__dict__", None)
    return {f".{key}": item for key, item in state.items()} if isinstance(state, dict) else {}


