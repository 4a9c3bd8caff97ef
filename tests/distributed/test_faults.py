"""A failing rank ends the whole launch within seconds, names itself, and leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strategies import DDPStrategy
from strategies.launcher import WorkerFailedError
from tests.helpers import ddp_workers
from tests.helpers.processes import alive, wait_until_ended

REPO = Path(__file__).parents[2]
PROMPT_S = 10  # from the failure to the raise; a surviving rank would otherwise sleep 60 s




def _children_of(parent: int) -> list[str]:
    """Live child processes of `parent` except multiprocessing's long-lived resource tracker."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == parent and fields[0] != "Z" and "resource_tracker" not in cmdline:
            found.append(f"{stat.parent.name}: {cmdline}")
    return found


def _worker_pids(pid_dir: Path) -> list[int]:
    """The pids the ranks wrote, rank 0's (the launching process's own) included."""
    return [int(path.read_text()) for path in sorted(pid_dir.glob("*.pid"))]


def _seconds_since_rank1_failed(pid_dir: Path) -> float:
    """Rank 1 writes its pid file just before it fails, so the file's mtime dates the failure."""
    return time.time() - (pid_dir / "1.pid").stat().st_mtime


def _strategy() -> DDPStrategy:
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=2)
    return strategy


@pytest.mark.timeout(90)
def test_raising_rank_ends_launch_with_its_rank_and_traceback(tmp_path: Path) -> None:
    strategy = _strategy()
    with pytest.raises(WorkerFailedError) as info:
        strategy.launch(ddp_workers.raise_on_rank_one, strategy, str(tmp_path))
    assert _seconds_since_rank1_failed(tmp_path) < PROMPT_S
    message = str(info.value)
    assert message.startswith("[rank: 1]") and info.value.rank == 1
    assert "ValueError: boom from rank one" in message and "Traceback" in message
    assert "raise_on_rank_one" in message  # the worker's own frame, not the launcher's
    pids = _worker_pids(tmp_path)
    assert pids[0] == os.getpid() and not alive(pids[1])  # rank 0 is this process, which survives
    assert _children_of(os.getpid()) == []


SCRIPT = textwrap.dedent("""
    import sys
    from strategies import DDPStrategy
    from tests.helpers import ddp_workers

    if __name__ == "__main__":
        strategy = DDPStrategy()
        strategy.configure(accelerator="cpu", devices=2)
        strategy.launch(ddp_workers.sigkill_rank_one, strategy, sys.argv[1])
""")


@pytest.mark.timeout(90)
def test_killed_rank_ends_the_job_nonzero_and_leaves_no_process(tmp_path: Path) -> None:
    script = tmp_path / "kill_one.py"
    script.write_text(SCRIPT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script), str(pid_dir)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert _seconds_since_rank1_failed(pid_dir) < PROMPT_S
    assert done.returncode != 0
    assert "WorkerFailedError: [rank: 1] worker was killed by signal 9 (SIGKILL" in done.stderr
    # Said once: elastic's own E-log copy of the failure is silenced when nothing restarts.
    assert not [line for line in done.stderr.splitlines() if re.match(r"E\d{4} ", line)], done.stderr
    pids = _worker_pids(pid_dir)
    assert len(pids) == 2 and not [pid for pid in pids if alive(pid)]


LAUNCHER = textwrap.dedent("""
    import sys
    from strategies import DDPStrategy
    from tests.helpers import ddp_workers

    if __name__ == "__main__":
        strategy = DDPStrategy(start_method=sys.argv[2])
        strategy.configure(accelerator="cpu", devices=2)
        strategy.launch(ddp_workers.record_pid_and_sleep, strategy, sys.argv[1])
""")


@contextlib.contextmanager
def _sleeping_workers(tmp_path: Path, start_method: str, **popen: Any) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A launcher process whose two workers sleep; yields it with the workers' pids, and leaves
    nothing running afterwards whatever the test did."""
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launcher = subprocess.Popen([sys.executable, str(script), str(pid_dir), start_method], cwd=REPO, env=env,
                                text=True, **popen)
    try:
        deadline = time.monotonic() + 60
        while len(list(pid_dir.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = _worker_pids(pid_dir)
        assert len(pids) == 2, "the workers never started"
        yield launcher, pids
    finally:
        launcher.kill()
        for pid in _worker_pids(pid_dir):
            if alive(pid):
                os.kill(pid, 9)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_workers_stop_when_their_launcher_is_killed(tmp_path: Path, start_method: str) -> None:
    # A forked worker's parent is the forkserver, which outlives a SIGKILLed launcher; the workers
    # must stop anyway, as spawned ones do through their parent-death signal.
    with _sleeping_workers(tmp_path, start_method, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL) as (launcher, pids):
        launcher.kill()
        launcher.wait()
        assert not wait_until_ended(pids, PROMPT_S)


def _as_in_a_terminal() -> None:
    """The launcher starts with SIGINT's default action, as a terminal's foreground job does. Under a
    background job (`make test &`, nohup, some CI runners) the test runner ignores SIGINT, a child inherits
    that across exec, and Python then leaves SIGINT ignored, as POSIX asks: Ctrl-C could not reach it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(90)
def test_ctrl_c_ends_the_launcher_and_every_worker(tmp_path: Path) -> None:
    # Ctrl-C in a terminal sends SIGINT to the whole foreground process group.
    with _sleeping_workers(tmp_path, "forkserver", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True, preexec_fn=_as_in_a_terminal) as (launcher, pids):
        os.killpg(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=PROMPT_S)
        assert launcher.returncode != 0 and "KeyboardInterrupt" in err
        assert not wait_until_ended(pids, PROMPT_S)
