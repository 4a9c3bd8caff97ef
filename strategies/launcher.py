"""Start one worker per local device through torch elastic, or run in place when the
processes already exist (torchrun, srun) or there is only one rank.

Launch = wrap(setup ∘ work): each worker runs `strategy.setup_environment()`, the user's
function and `strategy.teardown()`, under `@record` so elastic can report its traceback.
Restarts default to 0: a restart would silently mask a crash. Elastic's agent stops every
other worker as soon as one fails (SIGTERM, then SIGKILL), so nothing is left behind.

Workers are forked from a forkserver started at the beginning of the launch (see
`_worker_start_method`), or spawned where that is not possible or `start_method="spawn"`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record

from strategies.environment import LOCAL_LAUNCH_MARKER
from strategies.hang_guard import FAILURES_DIR_VARIABLE, write_failure_stamp
from strategies.rank_zero import rank_prefixed_message

if TYPE_CHECKING:
    from strategies.base import Strategy

SHUTDOWN_TIMEOUT_S = 5  # SIGTERM -> SIGKILL grace for the surviving workers after a failure
_PORT_ATTEMPTS = 3  # rendezvous ports tried when the picked one was taken in between
# What the forkserver imports once, so that every worker forked from it starts with them imported.
# Installed packages only: before Python 3.12.8 the server ignores the launcher's sys.path, so a
# name the user's working directory also has (a folder "strategies") would load the wrong module.
# Nothing that creates per-process state a fork would share: numpy >= 2 makes its global generator
# (from fresh entropy) when `numpy.random` is first imported, which happens in each worker.
_FORKSERVER_PRELOAD = ["torch", "torch.distributed.elastic.multiprocessing"]
# The forkserver passes at most 255 descriptors to a child, and elastic hands every worker two per
# local rank (the result queues): beyond this many local workers, spawn.
_MOST_FORKED_WORKERS = 64
# The signals torch elastic handles in the launching process and stops its workers with.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
                      if hasattr(signal, name))


class WorkerFailedError(RuntimeError):
    """A worker raised or died; `rank` is the first rank that failed, `traceback` its traceback
    (None when it was killed by a signal), `exitcode` its exit status when elastic saw it."""

    def __init__(self, rank: int, message: str, traceback: str | None = None, exitcode: int | None = None) -> None:
        super().__init__(rank_prefixed_message(message, rank))
        self.rank, self.traceback, self.exitcode = rank, traceback, exitcode


def launch(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
           nprocs: int, in_place: bool, max_restarts: int = 0, start_method: str = "forkserver") -> Any:
    """Run `fn(*args, **kwargs)` on every rank and return global rank 0's result.

    `in_place` means this process already is a rank (torchrun/srun, or a world of one).
    `start_method` is how local workers start: "forkserver" (where possible) or "spawn".
    """
    if in_place:
        strategy.setup_environment()
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            strategy.teardown()  # this process lives on (a notebook, a test): release the group
            raise
        _finish(strategy)
        return result
    with (tempfile.TemporaryDirectory(prefix="ddp-trainer-") as run_dir, _restored_process_state(),
          _worker_start_method(start_method, nprocs) as method):
        failures_dir = Path(run_dir, "failures")
        failures_dir.mkdir()
        # The work (often a whole model and its data) goes through a file, not as a spawn argument:
        # spawn writes arguments into a pipe that a child reads only after its imports, so a payload
        # larger than the pipe buffer made the parent start the workers one after the other.
        payload_path = Path(run_dir, "payload.pt")
        _serialize(strategy, fn, args, kwargs, payload_path)
        try:
            results = _run_agent(nprocs, max_restarts, method, run_dir, str(payload_path), str(failures_dir))
        except ChildFailedError as error:
            raise _first_failure(error, failures_dir) from None
        except SignalException as error:  # elastic's handler turned a signal into this; workers are stopped
            if error.sigval == signal.SIGINT:
                raise KeyboardInterrupt from error
            raise
    return pickle.loads(results[0])


@record
def _worker(payload_path: str, failures_dir: str, start_method: str) -> bytes | None:
    """Entry point of every worker (module level, so a new process can import it by name)."""
    if start_method == "forkserver":
        _behave_as_spawned()
    os.environ[LOCAL_LAUNCH_MARKER] = "1"
    os.environ[FAILURES_DIR_VARIABLE] = failures_dir  # the hang guard stamps its verdict there too
    # A rank killed by a C++ abort (gloo on mismatched collectives) leaves its Python stack here.
    faulthandler.enable(file=open(Path(failures_dir, f"{os.environ.get('RANK', '0')}.fault"), "w"))  # noqa: SIM115
    _split_cpu_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    try:
        strategy, fn, args, kwargs = _deserialize(payload_path)
        strategy.setup_environment()
        result = fn(*args, **kwargs)
        _finish(strategy)
        return pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL) if strategy.global_rank == 0 else None
    except BaseException:
        # Stamp the failure with a precise time before the process exits: the peers' errors
        # that this exit causes come later, so the earliest stamp is the root cause.
        write_failure_stamp(Path(failures_dir), traceback.format_exc())
        raise


def _behave_as_spawned() -> None:
    """Make a worker forked from the forkserver stop as a spawned one does.

    A spawned worker starts after the agent has installed its signal handlers, which exec resets:
    elastic's stop signals kill it (SIGINT raises KeyboardInterrupt), and torch's spawn wrapper sets
    SIGINT as its parent-death signal, so it also stops when the launching process is killed. A
    forked worker's parent is the server instead, which outlives a killed launcher, and it inherits
    the signal handlers the launching process had when the server started: under a background job,
    SIGINT and SIGQUIT ignored, so elastic's shutdown would wait out its grace period and SIGKILL.
    Only ignored signals are reset: a handler the user's script installed at import stays.
    """
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    _interrupt_when_the_launcher_dies()


def _interrupt_when_the_launcher_dies() -> None:
    """SIGINT this worker once the launching process is gone (its end of a pipe closes)."""
    launcher = multiprocessing.parent_process()
    if launcher is None:
        return

    def watch() -> None:
        wait([launcher.sentinel])
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, name="ddp-trainer-launcher-watch", daemon=True).start()


def _finish(strategy: Strategy) -> None:
    """Wait for every rank before tearing down: a rank that closed its connections while a peer
    was still reading the last collective would break that peer."""
    strategy.barrier("teardown")
    strategy.teardown()


def _split_cpu_threads(local_world_size: int) -> None:
    """Give each local rank its share of the CPUs, so N ranks do not oversubscribe N x cores."""
    if "OMP_NUM_THREADS" in os.environ:  # the user (or our parent) already decided
        threads = max(1, int(os.environ["OMP_NUM_THREADS"]))
    else:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cpus // max(1, local_world_size))
        os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def _run_agent(nprocs: int, max_restarts: int, start_method: str, run_dir: str, *worker_args: str) -> dict[int, Any]:
    """Run the workers under elastic's agent with a "static" rendezvous on a port picked here.

    Static, because one node has nothing to negotiate: the c10d handler's join protocol (a
    random 0-0.3 s start skew and several store round trips) cost ~0.5 s per launch. A port
    picked here can be taken by someone else before the agent binds it; the agent then fails
    before any worker exists, so trying another port is safe.
    """
    from torch.distributed import DistNetworkError
    from torch.distributed.launcher.api import elastic_launch  # heavy import, only when launching

    for attempt in range(1, _PORT_ATTEMPTS + 1):
        config = _launch_config(nprocs, max_restarts, start_method, run_dir, _free_port())
        try:
            with _quiet_worker_tracebacks(enabled=max_restarts == 0):
                results: dict[int, Any] = elastic_launch(config, _worker)(*worker_args, start_method)
            return results
        except DistNetworkError as error:
            if "EADDRINUSE" not in str(error) or attempt == _PORT_ATTEMPTS:
                raise
    raise RuntimeError("unreachable: the last attempt returns or raises")


@contextlib.contextmanager
def _quiet_worker_tracebacks(enabled: bool) -> Iterator[None]:
    """Elastic logs every failed worker's traceback (E-lines) before raising; without restarts our
    own report says the same, root cause first, so the copy only buries it. With restarts those
    lines are the only record of a failure that a restart then recovered from: keep them."""
    logger = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    previous = logger.level
    if enabled:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(previous)


@contextlib.contextmanager
def _worker_start_method(requested: str, nprocs: int) -> Iterator[str]:
    """Yield the multiprocessing start method of this launch's workers, and own its forkserver.

    With spawn every worker imports torch itself (~1 s each, and two imports on two cores are
    slower than one), and only after this process has written the payload and started the agent.
    A forkserver started here imports torch once *while* this process does that work; each worker
    is then forked from it with torch imported. The server is this launch's own and is stopped
    after it: a worker inherits the server's environment and file descriptors, so a server that
    outlived the launch would hand the next one a stale os.environ or stdout. For the same reason
    a server someone else started is not borrowed: then, as where the platform has no forkserver,
    workers are spawned. Plain fork is never used: a child forked from a process whose OpenMP pool
    has run hangs in its first multi-threaded op. What a forked worker would otherwise inherit
    differently is handled in `_behave_as_spawned` (signals, the launcher's death) and
    `_forking_is_safe` (numpy's generator). Two differences remain: forked workers share the
    server's string-hash seed, where spawned ones draw one each, and multiprocessing ends them with
    `os._exit`, so `atexit` hooks registered inside a worker do not run (the hang guard's one only
    protects interpreter finalization, which `os._exit` skips).
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch_config(nprocs: int, max_restarts: int, start_method: str, run_dir: str, port: int) -> Any:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    options: dict[str, Any] = dict(
        min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=uuid.uuid4().hex,
        rdzv_backend="static", rdzv_endpoint=f"127.0.0.1:{port}", rdzv_configs={"rank": 0},
        local_addr="127.0.0.1", max_restarts=max_restarts, monitor_interval=0.05, start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(Path(run_dir, "logs"))), shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    supported = LaunchConfig.__dataclass_fields__  # shutdown_timeout is recent; older torch lacks it
    return LaunchConfig(**{key: value for key, value in options.items() if key in supported})


def _first_failure(error: ChildFailedError, failures_dir: Path) -> WorkerFailedError:
    """Pick the root cause: a rank killed by a signal, else the earliest Python failure."""
    stamps = {int(path.stem): json.loads(path.read_text()) for path in failures_dir.glob("*.json")}
    for rank, failure in sorted(error.failures.items()):
        if failure.exitcode < 0 and rank not in stamps:
            return _killed_by_signal(rank, failure, failures_dir)
    if stamps:
        rank = min(stamps, key=lambda r: stamps[r]["time_ns"])
        text = stamps[rank]["traceback"].rstrip()
        exitcode = error.failures[rank].exitcode if rank in error.failures else None
        last_line = text.splitlines()[-1] if text else "unknown error"
        details = f"\n{text}" if "\n" in text else ""  # a one-line verdict (the hang guard's) is said once
        return WorkerFailedError(rank, f"worker failed: {last_line}{details}", traceback=text, exitcode=exitcode)
    rank, failure = error.get_first_failure()
    recorded = failure.message.get("extraInfo", {}).get("py_callstack") if isinstance(failure.message, dict) else None
    if recorded:  # @record caught it outside our stamping (e.g. while splitting threads)
        return WorkerFailedError(rank, f"worker failed:\n{recorded}", traceback=recorded, exitcode=failure.exitcode)
    return WorkerFailedError(rank, f"worker exited with code {failure.exitcode} (pid {failure.pid}) before "
                             f"running the function; its stderr above shows why. A script that launches must "
                             f"guard its entry point with `if __name__ == \"__main__\":` (spawn re-imports it).",
                             exitcode=failure.exitcode)


def _killed_by_signal(rank: int, failure: Any, failures_dir: Path) -> WorkerFailedError:
    """A rank that died without raising: say how, and where its Python code was when it did."""
    if failure.exitcode == -signal.SIGABRT:
        cause = ("the C++ runtime aborted it; gloo does this when ranks issue different collectives (its message "
                 "above says 'collective mismatch': e.g. self.log(..., sync_dist=True) on one rank only). Rerun "
                 "with DDPStrategy(debug_collectives=True) (strategy.debug_collectives=true) to name the first "
                 "collective that differs and its call site on every rank.")
    else:
        cause = "a kill by the OOM killer or an outside `kill` looks like this."
    fault = Path(failures_dir, f"{rank}.fault")
    stack = fault.read_text().strip() if fault.exists() else ""
    where = f"\nIts Python stack when it died:\n{stack}" if stack else ""
    return WorkerFailedError(rank, f"worker was killed by signal {-failure.exitcode} ({failure.signal_name()}, "
                             f"pid {failure.pid}) before it could raise; {cause}{where}", exitcode=failure.exitcode)


def _serialize(strategy: Strategy, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               path: Path) -> None:
    """Save the work to `path` with `torch.save`, in one piece.

    Every worker loads its own private copy of each tensor: torch.multiprocessing, which spawn
    would otherwise use, moves CPU tensors to shared memory, so N ranks would step the *same*
    parameters N times. One piece keeps shared references (the strategy inside `fn`'s arguments
    is the strategy the worker sets up). `torch.save` rather than plain pickle so that workers can
    map tensor storages from the file instead of materialising every tensor twice (bytes, then
    storage) while unpickling: that transient copy was the largest part of a rank's peak memory.
    """
    qualname = getattr(fn, "__qualname__", "")
    hint = (f"launch() runs {qualname or fn!r} in new processes, which import it by name and receive its "
            f"arguments pickled: define it at module level (not a lambda or a nested function) and pass "
            f"picklable arguments.")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(hint)
    try:
        torch.save((strategy, fn, args, kwargs), path, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise TypeError(f"{hint} Pickling failed: {error}") from error


def _deserialize(path: str) -> tuple[Strategy, Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """Load the parent's work. Storages are mapped copy-on-write (private to this rank).

    `weights_only=False`: the file is the launching process's own pickle of `fn` and its
    arguments, written a moment ago into a private temporary directory, not a checkpoint.
    """
    work: tuple[Strategy, Callable[..., Any], tuple[Any, ...], dict[str, Any]] = torch.load(
        path, mmap=True, weights_only=False)
    return work


@contextlib.contextmanager
def _restored_process_state() -> Iterator[None]:
    """Elastic installs signal handlers and sets an env variable in the launching process; put
    both back so a launch leaves the caller (a notebook, a test run) as it found it."""
    handlers = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    saved_env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            with contextlib.suppress(ValueError, TypeError):  # not the main thread / non-Python handler
                signal.signal(sig, handler)
        os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
        if saved_env is not None:
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = saved_env
