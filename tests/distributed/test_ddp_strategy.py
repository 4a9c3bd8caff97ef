"""DDPStrategy end to end on 2 real gloo workers started by torch elastic."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from strategies import DDPStrategy
from strategies.launcher import WorkerFailedError
from tests.helpers import ddp_workers
from tests.helpers.processes import alive

REPO = Path(__file__).parents[2]
# How ranks 1.. start: forked from this process where each rank runs one CPU thread (as Lightning's
# ddp_notebook forks), from the pool's forkserver where a rank runs more (a fork after OpenMP ran
# would hang), or spawned when asked: (start_method, OMP_NUM_THREADS).
STARTS = {"fork": ("forkserver", "1"), "forkserver": ("forkserver", "2"), "spawn": ("spawn", "1")}


def _strategy(**kwargs: Any) -> DDPStrategy:
    strategy = DDPStrategy(**kwargs)
    strategy.configure(accelerator="cpu", devices=2)
    return strategy


def _ranks_started_by(how: str, monkeypatch: pytest.MonkeyPatch) -> DDPStrategy:
    start_method, threads = STARTS[how]
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    return _strategy(start_method=start_method)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("ddp") / "model.ckpt"
    strategy = _strategy(bucket_cap_mb=0.00002, first_bucket_cap_mb=0.00002)  # ~20 bytes: several buckets
    result = strategy.launch(ddp_workers.everything, strategy, str(path), ddp_workers.TinyNet())
    result["path"] = path
    return result


@pytest.mark.timeout(120)
def test_launch_starts_two_elastic_workers(run: dict[str, Any]) -> None:
    ranks = run["ranks"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and [r["local_rank"] for r in ranks] == [0, 1]
    assert {r["world_size"] for r in ranks} == {2} and {r["backend"] for r in ranks} == {"gloo"}
    # Rank 0 is this process (Lightning's ddp); rank 1 is a new one
    assert ranks[0]["pid"] == os.getpid() and ranks[1]["pid"] != os.getpid()
    assert run["ranks"]["rank0_pid"] == ranks[0]["pid"]  # launch returns rank 0's result
    assert [r["environment"] for r in ranks] == ["LaunchingProcessEnvironment", "LocalEnvironment"]
    cpus = len(os.sched_getaffinity(0))
    expected = int(os.environ.get("OMP_NUM_THREADS", max(1, cpus // 2)))
    assert {r["threads"] for r in ranks} == {expected}


@pytest.mark.timeout(120)
def test_each_worker_gets_a_private_copy_of_the_arguments(run: dict[str, Any]) -> None:
    assert run["private"] == pytest.approx([0.0, 12.0])  # rank 1 added 1 to its 4x3 weight; rank 0 saw nothing


@pytest.mark.timeout(120)
def test_setup_module_broadcasts_rank0_and_gradients_agree(run: dict[str, Any]) -> None:
    train = run["train"]
    assert train["setup_equal"] and train["rank0_kept_its_init"]
    assert train["grads_equal"] == [True, True]
    # Step 1 leaves rank r's buffer at 1 + r; step 2 starts from rank 0's value (1) again.
    assert train["buffers"] == [[2.0, 2.0], [3.0, 3.0]]
    reducer = train["summary"]["reducer"]
    assert train["summary"]["world_size"] == 2 and reducer["buckets"] >= 2 and reducer["synced_steps"] == 2


@pytest.mark.timeout(120)
def test_collectives(run: dict[str, Any]) -> None:
    for rank, result in enumerate(run["collectives"]):
        assert result["mean"] == [1.5, 15.0] and result["sum"] == [3.0, 30.0]
        assert result["max"] == [2.0, 20.0] and result["min"] == [1.0, 10.0]
        assert result["int_mean"] == 0.5
        assert result["gather"] == [[0, 0], [1, 2]]
        assert result["broadcast"] == {"from": 1, "items": [1, 1, 1]}
        assert result["input_unchanged"], rank


@pytest.mark.timeout(120)
def test_checkpoint_is_written_by_rank0_only_and_read_by_all(run: dict[str, Any]) -> None:
    ranks = run["checkpoint"]["ranks"]
    assert [r["writers"] for r in ranks] == [[0], []]
    assert [r["weights"] for r in ranks] == [[0.0, 1.0, 2.0, 3.0]] * 2  # rank 0's values everywhere
    assert {r["step"] for r in ranks} == {7}
    assert sorted(p.name for p in run["path"].parent.iterdir()) == ["model.ckpt"]


@pytest.mark.timeout(120)
def test_different_models_on_different_ranks_are_named() -> None:
    strategy = _strategy()
    # Every rank finds it; rank 0's own error (this process's) is the one raised here.
    with pytest.raises((WorkerFailedError, RuntimeError),
                       match=r"parameters differ between ranks 0 and 1.*layer\.weight") as info:
        strategy.launch(ddp_workers.mismatched_parameters, strategy)
    assert "(4, 3)" in str(info.value) and "(5, 3)" in str(info.value)


@pytest.mark.timeout(120)
def test_workers_that_return_at_once_still_finish_cleanly() -> None:
    # No collective in the function: a fast rank used to tear down while its peer was still
    # connecting (gloo "Connection closed by peer"); init and teardown now meet at barriers.
    strategy = _strategy()
    assert [strategy.launch(ddp_workers.return_rank, strategy) for _ in range(2)] == [0, 0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", list(STARTS))
def test_workers_live_across_launches_see_the_launchers_environment_and_leave_no_server_behind(
        how: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from multiprocessing import forkserver

    strategy = _ranks_started_by(how, monkeypatch)
    seen = []
    for value in ("first", "second"):  # set between launches: the kept workers must see the change
        monkeypatch.setenv("DDP_TRAINER_TEST_VARIABLE", value)
        monkeypatch.chdir(tmp_path if value == "second" else REPO)
        ranks = strategy.launch(ddp_workers.start_facts, strategy, "DDP_TRAINER_TEST_VARIABLE")
        assert [rank["variable"] for rank in ranks] == [value, value]
        assert {rank["cwd"] for rank in ranks} == {os.getcwd()}
        assert ranks[0]["pid"] == os.getpid()  # rank 0 is this process
        # forked or spawned: rank 1 is this process's child; forkserver: the launch's server's
        assert (ranks[1]["ppid"] == os.getpid()) == (how != "forkserver")
        seen.append(ranks[1]["pid"])
    assert seen[0] == seen[1]  # the second launch ran in the same worker
    strategy.stop_workers()
    assert not alive(seen[0])
    assert forkserver._forkserver._forkserver_pid is None  # the pool's server is gone with it


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", list(STARTS))
def test_workers_stop_on_elastics_signals_even_when_the_launcher_ignores_them(
        how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Elastic stops the workers with the signal it received; a worker that inherited an ignored
    # SIGINT (the launcher ran as a background job) would sit out the grace period until SIGKILL.
    strategy = _ranks_started_by(how, monkeypatch)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
    try:
        ranks = strategy.launch(ddp_workers.stop_signal_handlers, strategy)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # SIGTERM is a preemption notice while a stage runs (the pool itself stops workers with SIGKILL)
    expected = {"SIGINT": "KeyboardInterrupt", "SIGTERM": "preemption notice", "SIGHUP": "default", "SIGQUIT": "default"}
    worker = ranks[1]  # rank 0 is this process, whose handlers are its own
    assert {k: v for k, v in worker.items() if k != "ppid"} == expected
    assert (worker["ppid"] == os.getpid()) == (how != "forkserver")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["fork", "forkserver"])
def test_forked_workers_do_not_share_numpys_random_stream(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Spawned workers seed numpy from fresh entropy each. Forked ones would all inherit a generator:
    # the server's if its preload imported `numpy.random` (it must not), this process's when rank 1
    # is forked from it (it draws afresh, as Python's `random` does after a fork).
    import numpy

    numpy.random.rand()  # this process's global generator exists before any rank starts
    strategy = _ranks_started_by(how, monkeypatch)
    ranks = strategy.launch(ddp_workers.unseeded_numpy_draw, strategy)
    assert (ranks[1]["ppid"] == os.getpid()) == (how == "fork")  # forked here, or by the server
    assert len({rank["draw"] for rank in ranks}) == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["fork", "forkserver"])
def test_dataloader_workers_inside_ranks_start_as_the_platform_starts_them(
        how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's DataLoader workers start with the platform's default (fork on Linux), as Lightning's
    ranks do, not through the fork, forkserver or spawn that started the rank (a forkserver or spawn
    re-imports the script and re-pickles the dataset for every worker, every epoch); a method the user
    chose is kept."""
    import multiprocessing

    strategy = _ranks_started_by(how, monkeypatch)
    platform = multiprocessing.get_context().get_start_method()
    ranks = strategy.launch(ddp_workers.loader_worker_start, strategy)  # rank 0 is this process
    assert [rank["default"] for rank in ranks] == [platform, platform]
    assert ranks[1]["forked_from_rank"] == (platform == "fork")
    strategy.stop_workers()
    chosen = "forkserver" if platform != "forkserver" else "spawn"
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(chosen, force=True)
    server_before = _forkserver_pid()
    try:
        ranks = strategy.launch(ddp_workers.loader_worker_start, strategy)
    finally:
        multiprocessing.set_start_method(previous, force=True)
        strategy.stop_workers()  # a pool's server, which rank 0's loader used too, stops with the pool
        _stop_a_forkserver_started_since(server_before)
    assert [rank["default"] for rank in ranks] == [chosen, chosen]
    assert ranks[1]["forked_from_rank"] == (chosen == "spawn")  # a forkserver's child is the server's


def _forkserver_pid() -> int | None:
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid  # type: ignore[no-any-return]


def _stop_a_forkserver_started_since(pid_before: int | None) -> None:
    """Rank 0 is this process: its own DataLoader, told to use a forkserver, starts the stdlib's server
    here where no pool's server ran (ranks forked from this process), and a script keeps it until it
    exits. The test stops it, so that the next test finds no child of this process."""
    from multiprocessing import forkserver

    pid = _forkserver_pid()
    if pid is not None and pid != pid_before:
        os.kill(pid, signal.SIGKILL)
        forkserver._forkserver._stop()


@pytest.mark.timeout(90)
def test_a_failed_rendezvous_here_does_not_break_the_next_launch() -> None:
    """torch counts groups by a counter only a destroy resets: after this process's own init failed,
    its next group would have been named unlike the fresh worker's, and the ranks never met."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    with pytest.raises(dist.DistError):
        dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=timedelta(seconds=1))
    strategy = DDPStrategy(timeout=timedelta(seconds=30))
    strategy.configure(accelerator="cpu", devices=2)
    assert strategy.launch(ddp_workers.return_rank, strategy) == 0
