"""Test hygiene and the slow-test marker, once for the whole suite.

`@pytest.mark.conformance` marks a slow run (a differential run against Lightning, a fault or kill
scenario, a second parametrisation of a multi-process case): skipped unless selected, so `make test`
stays within its 10 minutes on 2 cores; `make conformance` (`pytest -m conformance`, or
`DDP_CONFORMANCE=1 pytest`) runs them.

Hygiene: each test starts without a launcher's variables and
leaves no environment change, process group, thread of ours or file in the working directory behind.

A leak here would make a later test pass or fail for reasons of its own order (a seed set by
`seed_everything`, a process group a later in-place launch would join, a `lightning_logs/` a
later `ckpt_path="last"` would find), so it fails the test that leaked, naming what it left.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from strategies import launcher

from strategies.environment import LOCAL_LAUNCH_MARKER
from strategies.hang_guard import FAILURES_DIR_VARIABLE

# What torchrun, SLURM or our own launcher set in a rank: a test sees none of them unless it sets them.
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                    "MASTER_ADDR", "MASTER_PORT", LOCAL_LAUNCH_MARKER, FAILURES_DIR_VARIABLE)
LAUNCH_PREFIXES = ("SLURM_", "TORCHELASTIC_")
_OUR_THREADS = "ddp-trainer-"  # the prefix of every thread our code starts
_THREAD_GRACE_S = 5.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: slow run (skipped unless selected with -m conformance or "
                                       "DDP_CONFORMANCE=1; `make conformance` runs them)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = "conformance" in (config.getoption("markexpr", "") or "") or os.environ.get("DDP_CONFORMANCE") == "1"
    if selected:
        return
    skip = pytest.mark.skip(reason="slow run: select with -m conformance or DDP_CONFORMANCE=1 (make conformance)")
    for item in items:
        if item.get_closest_marker("conformance") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def module_env() -> Iterator[None]:
    """The environment as it was before the module, once its module-scoped fixtures are done: such a fixture
    runs before `launch_env` takes its snapshot, so `seed_everything` in one (PL_GLOBAL_SEED) would otherwise
    reach every later test, and every process they start (a Jupyter kernel then shuffled with that seed)."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(autouse=True)
def launch_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No launcher variables at the start; the whole environment as it was at the end."""
    before = dict(os.environ)
    for key in list(os.environ):
        if key in LAUNCH_VARIABLES or key.startswith(LAUNCH_PREFIXES):
            monkeypatch.delenv(key)
    yield monkeypatch
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(autouse=True)
def leaves_nothing_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    cwd = Path.cwd()
    files_before = set(os.listdir(cwd))
    yield
    problems = []
    # Workers a test's Trainer keeps for its next stage (and this process's end of their group, as
    # their rank 0) belong to it: a script's end stops them; here the test's end does.
    launcher.stop_workers()
    if dist.is_initialized():
        dist.destroy_process_group()
        problems.append("a process group (destroyed now)")
    threads = _our_threads_after_grace()
    if threads:
        problems.append(f"threads {threads}")
    new_files = sorted(set(os.listdir(cwd)) - files_before - {".pytest_cache", "__pycache__"})
    if new_files:
        problems.append(f"files in the working directory {cwd}: {new_files}")
    if problems:
        pytest.fail(f"{request.node.nodeid} left behind " + "; ".join(problems), pytrace=False)


def _our_threads_after_grace() -> list[str]:
    deadline = time.monotonic() + _THREAD_GRACE_S
    while True:
        alive = [t.name for t in threading.enumerate() if t.name.startswith(_OUR_THREADS) and t.is_alive()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)
