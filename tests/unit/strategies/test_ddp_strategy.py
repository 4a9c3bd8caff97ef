"""DDPStrategy without spawning: validation, resolution, in-place runs and failure reports."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from strategies import DDPStrategy, SingleDeviceStrategy, Strategy, resolve_strategy
from strategies.launcher import WorkerFailedError
from strategies.worker_failure import first_failure
from tests.helpers.spawn import free_port


@pytest.mark.parametrize(("kwargs", "error", "names"), [
    ({"bucket_cap_mb": 0}, ValueError, "bucket_cap_mb"),
    ({"bucket_cap_mb": "25"}, TypeError, "bucket_cap_mb"),
    ({"first_bucket_cap_mb": -1}, ValueError, "first_bucket_cap_mb"),
    ({"gradient_as_bucket_view": 1}, TypeError, "gradient_as_bucket_view"),
    ({"comm_hook": "fp8"}, ValueError, "comm_hook"),
    ({"comm_hook": 3}, TypeError, "comm_hook"),
    ({"process_group_backend": "tcp"}, ValueError, "process_group_backend"),
    ({"timeout": 30}, ValueError, "timeout"),
    ({"timeout": timedelta(0)}, ValueError, "timeout"),
    ({"max_restarts": -1}, ValueError, "max_restarts"),
    ({"accelerator": "tpu"}, ValueError, "accelerator"),
    ({"start_method": "fork"}, ValueError, "start_method"),
])
def test_constructor_names_the_bad_argument(kwargs: dict[str, Any], error: type[Exception], names: str) -> None:
    with pytest.raises(error, match=names):
        DDPStrategy(**kwargs)


def test_constructor_accepts_every_documented_form() -> None:
    DDPStrategy(bucket_cap_mb=0.5, comm_hook="fp16", process_group_backend="gloo", timeout=timedelta(seconds=5))
    DDPStrategy(comm_hook="bf16")
    DDPStrategy(comm_hook=lambda state, bucket: None)


@pytest.mark.parametrize(("strategy", "configure", "names"), [
    (DDPStrategy(process_group_backend="nccl"), {"accelerator": "cpu", "devices": 2}, "nccl"),
    (DDPStrategy(sync_batchnorm=True), {"accelerator": "cpu", "devices": 2}, "sync_batchnorm"),
    (DDPStrategy(), {"accelerator": "cpu", "devices": 0}, "devices"),
    (DDPStrategy(), {"accelerator": "cpu", "num_nodes": 0}, "num_nodes"),
])
def test_configure_rejects_impossible_combinations(strategy: DDPStrategy, configure: dict[str, Any],
                                                   names: str) -> None:
    with pytest.raises(ValueError, match=names):
        strategy.configure(**configure)


def test_resolve_strategy() -> None:
    assert isinstance(resolve_strategy("auto", devices=1, num_nodes=1), SingleDeviceStrategy)
    assert isinstance(resolve_strategy("auto", devices=2, num_nodes=1), DDPStrategy)
    assert isinstance(resolve_strategy("auto", devices=1, num_nodes=2), DDPStrategy)
    assert isinstance(resolve_strategy("ddp", devices=1, num_nodes=1), DDPStrategy)
    assert isinstance(resolve_strategy("single", devices=1, num_nodes=1), SingleDeviceStrategy)
    mine = DDPStrategy(bucket_cap_mb=1)
    assert resolve_strategy(mine, devices=4, num_nodes=1) is mine
    with pytest.raises(ValueError, match="'fsdp'.*'auto', 'ddp', 'ddp_spawn'.*'single'"):
        resolve_strategy("fsdp", devices=2, num_nodes=1)


@pytest.mark.parametrize(("name", "start_method", "find_unused"), [
    ("ddp", "forkserver", False), ("ddp_spawn", "spawn", False), ("ddp_fork", "forkserver", False),
    ("ddp_notebook", "forkserver", False), ("ddp_find_unused_parameters_true", "forkserver", True),
    ("ddp_find_unused_parameters_false", "forkserver", False),
    ("ddp_spawn_find_unused_parameters_true", "spawn", True), ("ddp_fork_find_unused_parameters_true", "forkserver", True),
    ("ddp_notebook_find_unused_parameters_true", "forkserver", True)])
def test_lightnings_ddp_names_have_lightnings_meaning(name: str, start_method: str, find_unused: bool) -> None:
    # Every name Lightning 2.6 registers for DDP; the fork variants start from a forkserver, which
    # needs no re-import of the script (a notebook's classes travel by value) and stays safe after
    # CUDA or OpenMP ran in the launching process.
    import pytorch_lightning as pl

    assert name in pl.strategies.StrategyRegistry
    strategy = resolve_strategy(name, devices=2, num_nodes=1)
    assert isinstance(strategy, DDPStrategy)
    assert (strategy.start_method, strategy.find_unused_parameters) == (start_method, find_unused)


def test_importing_strategies_stays_cheap() -> None:
    code = ("import sys, strategies; heavy = [m for m in ('trainer', 'pytorch_lightning', 'strategies.launcher', "
            "'strategies.reducer', 'torch.distributed.elastic.agent') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[3])
    assert out.stdout.strip() == "[]"


def test_ranks_before_launch_describe_the_configured_world() -> None:
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=3)
    assert (strategy.global_rank, strategy.world_size, strategy.is_global_zero) == (0, 3, True)


def test_lifecycle_errors_say_what_to_call_first() -> None:
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=2)
    with pytest.raises(RuntimeError, match="setup_module"):
        strategy.backward(torch.ones((), requires_grad=True))
    with pytest.raises(RuntimeError, match="setup_module"), strategy.no_sync():
        pass
    with pytest.raises(RuntimeError, match="launch"):
        strategy.setup_module(nn.Linear(1, 1))
    with pytest.raises(ValueError, match="op="):
        strategy.reduce(torch.ones(1), reduce_op="prod")  # type: ignore[arg-type]


def test_multi_node_without_an_outside_launcher_fails_before_starting_anything() -> None:
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=2, num_nodes=2)
    with pytest.raises(ValueError, match="num_nodes=2.*torchrun"):
        strategy.launch(print)


def test_unpicklable_argument_fails_before_starting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ranks cannot be forked (here: 2 CPU threads per rank), a lock cannot reach them: the error
    names it and why ranks were not forked, before any process starts. (Forked ranks inherit it, as
    under Lightning's ddp_notebook: tests/distributed/test_stages_share_workers.py.)"""
    import threading

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=2)
    with pytest.raises(TypeError, match=r"cannot be pickled.*\(lock\).*each rank gets 2 CPU threads"):
        strategy.launch(print, threading.Lock())


def _train_one_step(strategy: DDPStrategy, value: float) -> dict[str, Any]:
    module = nn.Linear(2, 1)
    strategy.setup_module(module)
    strategy.backward(module(torch.full((1, 2), value)).sum())
    assert module.weight.grad is not None
    return {"rank": strategy.global_rank, "world": strategy.world_size, "grad": module.weight.grad.tolist(),
            "reduced": strategy.reduce(torch.tensor([value]), reduce_op="mean").item(),
            "summary": strategy.summary()}


def test_world_of_one_runs_in_place_and_cleans_up() -> None:
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=1)
    result = strategy.launch(_train_one_step, strategy, 2.0)
    assert (result["rank"], result["world"], result["grad"], result["reduced"]) == (0, 1, [[2.0, 2.0]], 2.0)
    assert result["summary"]["reducer"]["world_size"] == 1
    assert not torch.distributed.is_initialized()
    assert "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ
    strategy.teardown()  # a second teardown is harmless


def test_under_torchrun_launch_is_a_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": "outside"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=1)
    result = strategy.launch(lambda s: (os.getpid(), s.summary()["environment"]), strategy)
    assert result == (os.getpid(), "TorchElasticEnvironment")
    # torchrun's process outlives the stage: the group stays for the next fit/test (re-creating it
    # on torchrun's store would hang) and goes with the process.
    assert torch.distributed.is_initialized()
    torch.distributed.destroy_process_group()


def test_world_size_mismatch_with_the_launcher_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1", "TORCHELASTIC_RUN_ID": "outside"}.items():
        monkeypatch.setenv(key, value)
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=2)
    with pytest.raises(ValueError, match=r"^\[rank: 0\] the launcher started 4 processes.*devices=2"):
        strategy.setup_environment()


def test_only_configuration_is_pickled_into_workers() -> None:
    strategy = DDPStrategy(bucket_cap_mb=3)
    strategy.configure(accelerator="cpu", devices=2)
    strategy._reducer = object()  # type: ignore[assignment]  # per-process state must not travel
    clone = pickle.loads(pickle.dumps(strategy))
    assert clone._reducer is None and clone.bucket_cap_mb == 3.0 and clone.devices == 2


# ---------------------------------------------------------------- which failure is the root cause
def _stamp(directory: Path, rank: int, time_ns: int, error: str) -> None:
    text = f"Traceback (most recent call last):\n  ...\n{error}\n"
    (directory / f"{rank}.json").write_text(json.dumps({"time_ns": time_ns, "traceback": text}))


def test_earliest_python_failure_is_reported_first(tmp_path: Path) -> None:
    _stamp(tmp_path, 0, 200, "RuntimeError: connection closed by peer")
    _stamp(tmp_path, 1, 100, "ValueError: boom")
    error = first_failure({0: 1}, tmp_path)
    assert isinstance(error, WorkerFailedError) and error.rank == 1
    assert str(error).startswith("[rank: 1] worker failed: ValueError: boom")
    assert error.traceback is not None and "Traceback" in error.traceback


def test_a_rank_killed_by_a_signal_is_the_root_cause(tmp_path: Path) -> None:
    _stamp(tmp_path, 0, 100, "RuntimeError: connection closed by peer")
    error = first_failure({0: 1, 1: -9}, tmp_path)
    assert error.rank == 1 and error.exitcode == -9 and "SIGKILL" in str(error)


def test_a_worker_that_left_without_raising_is_still_reported(tmp_path: Path) -> None:
    error = first_failure({1: 1}, tmp_path)
    assert str(error).startswith("[rank: 1] worker exited with code 1") and error.exitcode == 1


def _fail_in_place(strategy: DDPStrategy) -> None:
    raise RuntimeError("failed in place")


def test_in_place_failure_still_releases_the_process_group() -> None:
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=1)
    with pytest.raises(RuntimeError, match="failed in place"):
        strategy.launch(_fail_in_place, strategy)
    assert not torch.distributed.is_initialized()
    assert "MASTER_PORT" not in os.environ
