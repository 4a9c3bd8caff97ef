"""Naming a failed stage: which worker failed first, and how (a Python error, a signal, an exit).

When one rank fails, its peers fail a moment later in the collective it left: the root cause is
the earliest failure, which the workers stamp into the pool's failures folder with a precise time
(strategies/hang_guard.py writes the stamps). This module reads the stamps and the exit codes and
turns them into the one `WorkerFailedError` the launching process raises.
"""

from __future__ import annotations

import json
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from strategies.rank_zero import rank_prefixed_message

# For a worker whose pipe closed: how long until its exit code is known.
EXIT_CODE_WAIT_S = 2
# How a collective's error reads when a peer went away (gloo, NCCL): rank 0 then waits for the death.
_PEER_GONE_WORDS = ("connection", "closed", "reset by peer", "gloo", "nccl", "broken pipe")


class WorkerFailedError(RuntimeError):
    """A worker raised or died; `rank` is the first rank that failed, `traceback` its traceback
    (None when it was killed by a signal), `exitcode` its exit status."""

    def __init__(self, rank: int, message: str, traceback: str | None = None, exitcode: int | None = None) -> None:
        super().__init__(rank_prefixed_message(message, rank))
        self.rank, self.traceback, self.exitcode = rank, traceback, exitcode


class StageInterrupted(BaseException):
    """Raised inside the launching process's stage when a worker failed meanwhile (a BaseException,
    so a user's `except Exception` in a step cannot swallow it); `WorkerPool.run` replaces it with the
    worker's `WorkerFailedError`."""


def failed_exit_codes(processes: list[Any]) -> dict[int, int]:
    """Workers (global ranks 1..) that ended on their own with a non-zero code, by rank: their codes say why."""
    codes = {rank: process.exitcode for rank, process in enumerate(processes, start=1)}
    return {rank: code for rank, code in codes.items() if code is not None and code != 0}


def peer_connection_error(error: BaseException) -> bool:
    """Whether `error` is how a collective reports a peer that went away (gloo: the connection
    closed or was reset; NCCL: the communicator was aborted)."""
    if isinstance(error, (StageInterrupted, ConnectionError)):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(word in text for word in _PEER_GONE_WORDS)


def failed_alike(error: BaseException, failure: WorkerFailedError) -> bool:
    """Whether rank 0 raised, on its own, the very exception the worker did (type and message: a check every
    rank makes at the same point, as the non-finite check does). Then rank 0's own exception is what the caller
    gets, whichever rank was a moment sooner, as under Lightning's launcher, where the main process's own
    error is what the script sees. A lost peer is no such check: the same "connection closed" on two ranks is
    the symptom of a third rank's death, which stays a worker failure (`max_restarts` restarts those)."""
    if failure.traceback is None or peer_connection_error(error):  # also StageInterrupted
        return False
    own = "".join(traceback.format_exception_only(error)).rstrip()
    return bool(own) and ("\n" + failure.traceback.rstrip()).endswith("\n" + own)  # whole lines only


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
    return _exited_without_raising(rank, code, failures_dir)


def _exited_without_raising(rank: int, code: int, failures_dir: Path) -> WorkerFailedError:
    """A rank that ended with an exit code and no traceback: say where its stderr went, and give the
    `__main__` advice only where it fits: the rank died while starting (before it wrote its fault
    file), which is how a script without the guard ends when spawn or forkserver re-import it."""
    while_starting = not Path(failures_dir, f"{rank}.fault").exists()
    if while_starting and _caller_is_a_script():
        return WorkerFailedError(rank, f"worker exited with code {code} while it started, before it could run the "
                                 f"stage; its stderr says why. {stderr_whereabouts()} Starting a rank by spawn or "
                                 f"forkserver re-imports the script that launches, so the script must guard its "
                                 f"entry point with `if __name__ == \"__main__\":`.", exitcode=code)
    when = "while it started" if while_starting else "in the middle of a stage"
    return WorkerFailedError(rank, f"worker exited with code {code} {when} without raising (`os._exit()`, or a C "
                             f"library ending the process); its stderr says why. {stderr_whereabouts()}",
                             exitcode=code)


def _caller_is_a_script() -> bool:
    """Whether `__main__` is a file that a spawned or forkserver-started rank re-imports (not a
    notebook, an interactive session or `python -c`)."""
    main = sys.modules.get("__main__")
    return getattr(main, "__file__", None) is not None and not in_jupyter_kernel()


def in_jupyter_kernel() -> bool:
    """Whether this process is a Jupyter kernel (ipykernel), asked without importing IPython."""
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return False
    shell = getattr(sys.modules["IPython"], "get_ipython", lambda: None)()
    return shell is not None and getattr(shell, "kernel", None) is not None


def stderr_whereabouts() -> str:
    """Where a worker's stderr went, as a sentence. Workers write to this process's file descriptor 2.
    A Jupyter kernel forwards that descriptor to the running cell where it can (ipykernel >= 6 on Linux
    and macOS, `capture_fd_output`); otherwise it goes to the kernel's own console, never to the cell. A
    rank forked from the kernel inherits the kernel's `sys.stderr` object, which sends through a pipe of
    its own and loses what was not yet sent when the process ends with `os._exit`."""
    if not in_jupyter_kernel():
        return "Its stderr is this process's (above)."
    if getattr(sys.stderr, "_should_watch", False):  # ipykernel's OutStream: the descriptor is forwarded
        return ("The Jupyter kernel forwarded its stderr to this cell's output (above) and to the kernel's console "
                "(what a rank forked from the kernel printed through `sys.stderr` just before it ended at once is lost: "
                "that goes through the kernel's own stream, which such an end never flushes).")
    return ("Its stderr went to the Jupyter kernel's console (the terminal or log of the process running the "
            "kernel), not to this cell.")


def _killed_by_signal(rank: int, code: int, failures_dir: Path) -> WorkerFailedError:
    """A rank that died without raising: say how, and where its Python code was when it did."""
    if code == -signal.SIGABRT:
        cause = (f"the C++ runtime aborted it; gloo does this when ranks issue different collectives (its stderr "
                 f"says 'collective mismatch': e.g. self.log(..., sync_dist=True) on one rank only). Rerun "
                 "with DDPStrategy(debug_collectives=True) (strategy.debug_collectives=true) to name the first "
                 f"collective that differs and its call site on every rank. {stderr_whereabouts()}")
    else:
        cause = "a kill by the OOM killer or an outside `kill` looks like this."
    fault = Path(failures_dir, f"{rank}.fault")
    stack = fault.read_text().strip() if fault.exists() else ""
    where = f"\nIts Python stack when it died:\n{stack}" if stack else ""
    name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
    return WorkerFailedError(rank, f"worker was killed by signal {-code} ({name}) before it could raise; "
                             f"{cause}{where}", exitcode=code)
