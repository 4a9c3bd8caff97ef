"""How a pool's worker processes start: from a forkserver of the pool's own that imported torch
once, or spawned (each imports torch itself). Never plain fork for a pool: a child forked from a
process whose OpenMP pool has run hangs in its first multi-threaded op (ranks forked for one stage
run one thread each: strategies/forked_ranks.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from multiprocessing import forkserver
from typing import Any

# What the forkserver imports once, so that every worker forked from it starts with them imported.
# Installed packages only: before Python 3.12.8 the server ignores the launcher's sys.path, so a
# name the user's working directory also has (a folder "strategies") would load the wrong module.
# Nothing that creates per-process state a fork would share: numpy >= 2 makes its global generator
# (from fresh entropy) when `numpy.random` is first imported, which happens in each worker.
_FORKSERVER_PRELOAD = ["torch", "torch.distributed"]
# The forkserver passes at most 255 descriptors to a child: beyond this many local workers, spawn.
_MOST_FORKED_WORKERS = 64


@contextlib.contextmanager
def worker_start_method(requested: str, nprocs: int) -> Iterator[str]:
    """Yield the multiprocessing start method of this pool's workers, and own its forkserver.

    With spawn every worker imports torch itself (~1 s each, and two imports on two cores are
    slower than one). A forkserver started here imports torch once *while* this process writes
    the payload; each worker is then forked from it with torch imported. The server is this
    pool's own and is stopped with it: a worker inherits the server's environment and file
    descriptors, so a server that outlived its pool would hand the next one a stale os.environ
    or stdout (and the server reports its workers' exit codes, so it must outlive them). A
    server someone else started is not borrowed: then, as where the platform has no forkserver,
    workers are spawned. Forked workers share the server's string-hash seed, where spawned ones
    draw one each.
    """
    if requested == "fork":  # ranks forked from the caller for one stage (strategies/forked_ranks.py decided)
        yield "fork"
        return
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


@contextlib.contextmanager
def main_without_a_missing_file() -> Iterator[None]:
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
