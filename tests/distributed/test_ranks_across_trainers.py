"""Ranks 1..N-1 belong to the process, not to one Trainer (#36): a second Trainer reaches the pool's
workers (or forks afresh) without a cold start, Trainers whose group options differ never share a
group, a failure ends the stage and the next Trainer works, every rank sees the same restart count,
and nothing is left behind."""

from __future__ import annotations

import cProfile
import gc
import os
import pstats
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy, launcher
from strategies.launcher import WorkerFailedError
from tests.helpers.processes import alive, wait_until_ended
from trainer import LightningModule, Trainer
from trainer.callbacks import Callback

THREADS = {"fork": "1", "pool": "2"}  # one CPU thread per rank lets ranks be forked (see launcher.py)


# `make test` runs the forked ranks (the default on a small CPU), ~1 s a test; the pool's, which start
# from a forkserver and take 15-20 s each on 2 loaded cores, run with `-m conformance`.
@pytest.fixture(params=["fork", pytest.param("pool", marks=pytest.mark.conformance)])
def ranks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("OMP_NUM_THREADS", THREADS[request.param])
    return str(request.param)


class Recorder(Callback):
    """Writes, per rank and stage, the pid, the restart count the rank's environment and strategy see,
    and the group's timeout as the backend holds it."""

    def __init__(self, out: Path, name: str) -> None:
        self.out, self.name = out, name

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        fields = [os.getpid(), os.environ.get("TORCHELASTIC_RESTART_COUNT"), trainer.strategy.restart_count,
                  int(backend.options._timeout.total_seconds()), dist.get_world_size()]
        Path(self.out, f"{self.name}-{trainer.global_rank}.txt").write_text(" ".join(map(str, fields)))


class Regressor(LightningModule):
    def __init__(self, fail_on_rank: int | None = None) -> None:
        super().__init__()
        self.layer, self.fail_on_rank = nn.Linear(4, 1), fail_on_rank

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.fail_on_rank == self.global_rank:
            raise ValueError(f"planted failure on rank {self.global_rank}")
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 4, generator=generator), torch.randn(16, 1, generator=generator)),
                      batch_size=4)


def _fit(out: Path, name: str, devices: int = 2, model: LightningModule | None = None,
         **strategy: Any) -> list[list[str]]:
    # A loaded machine can keep a rank in its first lazy imports longer than the hang guard's default.
    strategy.setdefault("stall_timeout", 120.0)
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=DDPStrategy(**strategy), max_epochs=1,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[Recorder(out, name)])
    trainer.fit(model or Regressor(), _loader())
    return _records(out, name, devices)


def _records(out: Path, name: str, devices: int = 2) -> list[list[str]]:
    return [Path(out, f"{name}-{rank}.txt").read_text().split() for rank in range(devices)]


def _ranks_alive(*fits: list[list[str]]) -> list[int]:
    """The processes of ranks 1.. of these fits that still run."""
    return [int(rank[0]) for fit in fits for rank in fit[1:] if alive(int(rank[0]))]


@pytest.mark.conformance  # four Trainers, two world sizes: ~11 s forked
@pytest.mark.timeout(240)
def test_trainers_share_ranks_but_never_a_group_with_other_options(tmp_path: Path, ranks: str) -> None:
    first = _fit(tmp_path, "a", timeout=timedelta(minutes=10))
    second = _fit(tmp_path, "b", timeout=timedelta(minutes=10))
    third = _fit(tmp_path, "c", timeout=timedelta(minutes=7))
    fourth = _fit(tmp_path, "d", devices=3, timeout=timedelta(minutes=7))
    for fit in (first, second, third, fourth):
        assert int(fit[0][0]) == os.getpid()  # rank 0 is the caller
    assert first[1][0] == second[1][0] == third[1][0]  # the same rank 1 served three Trainers
    assert fourth[1][0] != first[1][0] and not alive(int(first[1][0]))  # another world size: other ranks
    # Each group has its own Trainer's timeout on every rank (a shared group would keep the first's).
    assert [fit[rank][3] for fit in (first, third, fourth) for rank in (0, 1)] == ["600", "600", "420", "420",
                                                                                  "420", "420"]
    assert [fit[0][4] for fit in (first, fourth)] == ["2", "3"]
    launcher.stop_workers()
    assert wait_until_ended([int(rank[0]) for fit in (first, fourth) for rank in fit[1:]], 10) == []


@pytest.mark.timeout(240)
def test_a_failing_rank_ends_the_stage_and_the_next_trainer_works(tmp_path: Path, ranks: str) -> None:
    warm = _fit(tmp_path, "warm")
    with pytest.raises(WorkerFailedError, match=r"^\[rank: 1\] worker failed: ValueError: planted failure on rank 1"):
        _fit(tmp_path, "failing", model=Regressor(fail_on_rank=1))
    failing = _records(tmp_path, "failing")
    assert wait_until_ended([int(failing[1][0])], 10) == [] and _ranks_alive(warm) == []  # every rank ended
    after = _fit(tmp_path, "after")
    assert int(after[0][0]) == os.getpid() and alive(int(after[1][0]))  # kept for the next Trainer


@pytest.mark.timeout(240)
def test_a_group_destroyed_between_trainers_is_made_again(tmp_path: Path, ranks: str) -> None:
    """A script (or a test harness: Lightning's conftest does it after every test) may destroy the
    default group between two fits; the next Trainer's ranks meet in a new group instead of the kept
    ranks waiting in the old one while this process makes another (a hang, or a reset connection)."""
    first = _fit(tmp_path, "first")
    dist.destroy_process_group()
    second = _fit(tmp_path, "second")
    assert first[1][0] == second[1][0]  # the same rank 1 served both Trainers, in a new group
    assert [rank[4] for rank in second] == ["2", "2"]


@pytest.mark.timeout(240)
def test_every_rank_sees_the_same_restart_count(tmp_path: Path, ranks: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank 1 that dies in the first attempt is restarted; the second attempt's ranks, the caller
    included, read restart count 1 from the environment and the strategy; afterwards the caller's
    environment is as it was."""

    class DiesOnceOnRankOne(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.global_rank == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
                os._exit(3)
            return super().training_step(batch, batch_idx)

    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    with pytest.warns(RuntimeWarning, match="restarting the workers"):
        fit = _fit(tmp_path, "restarted", model=DiesOnceOnRankOne(), max_restarts=1)
    assert [rank[1:3] for rank in fit] == [["1", "1"], ["1", "1"]]
    assert "TORCHELASTIC_RESTART_COUNT" not in os.environ


class CollectsOnRankOne(Regressor):
    """Holds a lock, so that no stage of it pickles and each forks its ranks afresh; rank 1 collects
    garbage at every step, as Python's own collection may at any allocation."""

    def __init__(self) -> None:
        super().__init__()
        self.guard = threading.Lock()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == 1:
            gc.collect()
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.global_rank == 1:
            gc.collect()


def _garbage_holding_a_store_server() -> None:
    """A cycle, left to the collector, that holds a store whose server thread only this process has."""
    garbage: list[Any] = [dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)]
    garbage.append(garbage)


@pytest.mark.timeout(120)
def test_a_forked_rank_never_frees_what_the_caller_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank forked from this process inherits its garbage, and the stores of its earlier stages, whose
    C++ destructors join threads the rank does not have: freeing one there would hang the rank (the
    next Trainer's rank 1 missed its group's first barrier). Two stages of one Trainer, each forked
    afresh, with such garbage before each, and rank 1 collecting at every step."""
    monkeypatch.setenv("OMP_NUM_THREADS", THREADS["fork"])
    trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(stall_timeout=60.0), max_epochs=1,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0)
    model = CollectsOnRankOne()
    _garbage_holding_a_store_server()
    trainer.fit(model, _loader())
    _garbage_holding_a_store_server()
    trainer.validate(model, _loader())
    assert trainer.state.status == "finished" and trainer.global_step == 2
    gc.collect()  # the stores' servers end here, where their threads are


@pytest.mark.timeout(120, method="thread")  # the bug hung signal handlers too: only a thread ends it
def test_a_profiler_works_after_a_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a stage the caller's interpreter is as it was: the stage's watch once cleared its (unsent)
    interruption in a way that left CPython's "asynchronous exception pending" flag set, and the next
    fit run under cProfile (or pdb, or coverage) looped forever on its first call. A multirun's 2nd job,
    profiled, did."""
    monkeypatch.setenv("OMP_NUM_THREADS", THREADS["fork"])
    first = _fit(tmp_path, "plain")
    profiler = cProfile.Profile()
    second = profiler.runcall(_fit, tmp_path, "profiled")
    assert [row[0] for row in second] == [row[0] for row in first]  # the same ranks served the profiled fit
    calls = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    assert any(function == "fit" and file.endswith("trainer.py") for file, _, function in calls)
