"""Looking at processes from a test: is one still alive, has a set of them ended in time."""

from __future__ import annotations

import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_until_ended(pids: list[int], timeout_s: float) -> list[int]:
    """Wait up to `timeout_s` for every pid to end; return those still alive."""
    deadline = time.monotonic() + timeout_s
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]
