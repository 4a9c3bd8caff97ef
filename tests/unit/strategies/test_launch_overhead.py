"""Launch-cost pieces of strategies/launcher.py and worker_start.py, checked without starting
workers: the work travels as a file (private tensors, by value where it must), and workers
start from a forkserver the pool owns, or are spawned where forking them is not safe."""

from __future__ import annotations

import subprocess
import sys
from multiprocessing import forkserver
from pathlib import Path

import pytest
import torch
from torch import nn

from strategies import DDPStrategy, launcher, worker_start
from strategies.worker import load_work


def _work(value: int) -> int:
    return value


def _strategy() -> DDPStrategy:
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=2)
    return strategy


def test_work_travels_as_a_file_and_loads_as_private_tensors(tmp_path: Path) -> None:
    path = tmp_path / "payload.pt"
    launcher._serialize(_strategy(), _work, (torch.arange(4.0),), {}, path)
    strategy, fn, args, kwargs = load_work(str(path))
    assert fn is _work and isinstance(strategy, DDPStrategy) and kwargs == {}
    assert torch.equal(args[0], torch.arange(4.0)) and not args[0].is_shared()


def _build_local_module() -> nn.Module:
    class Local(nn.Module):  # a class no other process can import by name
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x) + 1

    return Local()


def test_classes_and_lambdas_defined_anywhere_travel_by_value(tmp_path: Path) -> None:
    path = tmp_path / "payload.pt"
    module = _build_local_module()
    launcher._serialize(_strategy(), lambda m: m(torch.ones(2)), (module,), {}, path)
    # A fresh interpreter, as a spawned worker is: it has never seen `Local` or the lambda.
    code = ("import torch; from strategies.worker import load_work; "
            f"s, fn, args, kw = load_work({str(path)!r}); print(type(args[0]).__name__, float(fn(args[0])))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parents[3])
    assert done.stdout.split() == ["Local", str(float(module(torch.ones(2))))]


def test_what_cannot_be_pickled_is_named(tmp_path: Path) -> None:
    with open(tmp_path / "f.txt", "w") as handle, pytest.raises(TypeError, match="cannot be pickled"):
        launcher._serialize(_strategy(), _work, (handle,), {}, tmp_path / "payload.pt")


def test_the_pool_owns_its_forkserver() -> None:
    with worker_start.worker_start_method("forkserver", 2) as method:
        assert method == "forkserver" and forkserver._forkserver._forkserver_pid is not None
    assert forkserver._forkserver._forkserver_pid is None  # stopped with the pool


@pytest.mark.parametrize("reason", ["numpy 1", "too many workers"])
def test_workers_are_spawned_where_forking_them_is_not_safe(reason: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # numpy 1 imports numpy.random with numpy: forked ranks would share one global generator.
    if reason == "numpy 1":
        monkeypatch.setattr(sys.modules["numpy"], "__version__", "1.26.4")
    else:
        monkeypatch.setattr(worker_start, "_MOST_FORKED_WORKERS", 1)
    with worker_start.worker_start_method("forkserver", 2) as method:
        assert method == "spawn"


def test_a_forkserver_someone_else_started_is_not_borrowed() -> None:
    # Its workers would inherit that server's (older) environment and stdout: spawn instead.
    forkserver.ensure_running()
    theirs = forkserver._forkserver._forkserver_pid
    try:
        with worker_start.worker_start_method("forkserver", 2) as method:
            assert method == "spawn"
        assert forkserver._forkserver._forkserver_pid == theirs  # left running for its owner
    finally:
        forkserver._forkserver._stop()
