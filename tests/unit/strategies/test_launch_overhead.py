"""Launch-cost fixes in strategies/launcher.py, checked without starting workers: the work
travels as a file (not through spawn's pipe), the static rendezvous retries a taken port, and
workers start from a forkserver owned by the launch."""

from __future__ import annotations

import pickle
import sys
from multiprocessing import forkserver
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.launcher.api as elastic_api

from strategies import DDPStrategy, launcher


def _work(value: int) -> int:
    return value


class _FakeElastic:
    """Stands in for elastic_launch: records each config and the worker's arguments."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures, self.configs, self.loaded = failures, [], []

    def __call__(self, config: Any, entry: Any) -> Any:
        self.configs.append(config)

        def run(payload_path: str, failures_dir: str, start_method: str) -> dict[int, bytes]:
            if self.failures:
                raise self.failures.pop(0)
            self.loaded.append(launcher._deserialize(payload_path))
            return {0: pickle.dumps(7)}

        return run


def _launch(monkeypatch: pytest.MonkeyPatch, failures: list[BaseException]) -> tuple[Any, _FakeElastic]:
    fake = _FakeElastic(failures)
    monkeypatch.setattr(elastic_api, "elastic_launch", fake)
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=2)
    weights = torch.arange(4.0)
    result = launcher.launch(strategy, _work, (weights,), {}, nprocs=2, in_place=False)
    return result, fake


def test_work_travels_as_a_file_and_loads_as_private_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    result, fake = _launch(monkeypatch, [])
    assert result == 7
    strategy, fn, args, kwargs = fake.loaded[0]
    assert fn is _work and isinstance(strategy, DDPStrategy) and kwargs == {}
    assert torch.equal(args[0], torch.arange(4.0)) and not args[0].is_shared()
    config = fake.configs[0]
    assert config.rdzv_backend == "static" and not config.rdzv_endpoint.endswith(":0")
    assert config.start_method == "forkserver" and forkserver._forkserver._forkserver_pid is None  # stopped


@pytest.mark.parametrize("reason", ["numpy 1", "too many workers"])
def test_workers_are_spawned_where_forking_them_is_not_safe(reason: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # numpy 1 imports numpy.random with numpy: forked ranks would share one global generator.
    if reason == "numpy 1":
        monkeypatch.setattr(sys.modules["numpy"], "__version__", "1.26.4")
    else:
        monkeypatch.setattr(launcher, "_MOST_FORKED_WORKERS", 1)
    result, fake = _launch(monkeypatch, [])
    assert result == 7 and fake.configs[0].start_method == "spawn"


def test_a_forkserver_someone_else_started_is_not_borrowed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its workers would inherit that server's (older) environment and stdout: spawn instead.
    forkserver.ensure_running()
    theirs = forkserver._forkserver._forkserver_pid
    try:
        result, fake = _launch(monkeypatch, [])
        assert result == 7 and fake.configs[0].start_method == "spawn"
        assert forkserver._forkserver._forkserver_pid == theirs  # left running for its owner
    finally:
        forkserver._forkserver._stop()


def test_a_taken_rendezvous_port_is_retried_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = dist.DistNetworkError("The server socket has failed to listen ... code: -98, name: EADDRINUSE")
    result, fake = _launch(monkeypatch, [taken])
    assert result == 7 and len(fake.configs) == 2


def test_other_network_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(dist.DistNetworkError, match="connection refused"):
        _launch(monkeypatch, [dist.DistNetworkError("connection refused")])
