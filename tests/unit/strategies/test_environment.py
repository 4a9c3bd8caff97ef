"""Environment detection from launcher variables (no processes: env vars are monkeypatched)."""

from __future__ import annotations

import pytest

from strategies.environment import (LOCAL_LAUNCH_MARKER, LocalEnvironment, SLURMEnvironment, TorchElasticEnvironment,
                                    detect_environment, first_host, processes_launched_externally)

TORCHRUN = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc"}
SLURM = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1",
         "SLURM_NODELIST": "gpu[07-08,12],cpu1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "123456"}


def _set(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for key, value in values.items():
        monkeypatch.setenv(key, value)


def test_torchrun_variables_give_ranks_and_address(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, TORCHRUN)
    env = detect_environment()
    assert isinstance(env, TorchElasticEnvironment)
    assert (env.world_size, env.global_rank, env.local_rank, env.node_rank) == (8, 5, 1, 1)
    assert (env.main_address, env.main_port) == ("10.0.0.1", 29500)
    assert processes_launched_externally()


def test_torchrun_needs_every_variable(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, {k: v for k, v in TORCHRUN.items() if k != "TORCHELASTIC_RUN_ID"})
    assert not TorchElasticEnvironment.detect()
    assert isinstance(detect_environment(), LocalEnvironment)
    assert not processes_launched_externally()


def test_our_own_workers_are_local_not_external(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, {**TORCHRUN, LOCAL_LAUNCH_MARKER: "1"})
    env = detect_environment(default_world_size=2)
    assert isinstance(env, LocalEnvironment)
    assert (env.world_size, env.global_rank, env.local_rank, env.main_port) == (8, 5, 1, 29500)
    assert not processes_launched_externally()


def test_plain_process_is_rank_zero_of_the_configured_world() -> None:
    env = detect_environment(default_world_size=3)
    assert isinstance(env, LocalEnvironment)
    assert (env.world_size, env.global_rank, env.local_rank, env.node_rank) == (3, 0, 0, 0)
    assert env.main_address == "127.0.0.1"
    assert env.main_port == env.main_port > 0  # a free port, chosen once


def test_slurm_variables_give_ranks_and_first_host(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, SLURM)
    env = detect_environment()
    assert isinstance(env, SLURMEnvironment)
    assert (env.world_size, env.global_rank, env.local_rank, env.node_rank) == (4, 3, 1, 1)
    assert env.main_address == "gpu07"
    assert env.main_port == 15000 + 123456 % 10000
    assert processes_launched_externally()


def test_slurm_master_variables_win(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, {**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "1234"})
    env = SLURMEnvironment()
    assert (env.main_address, env.main_port) == ("head", 1234)


@pytest.mark.parametrize("overrides", [{"SLURM_JOB_NAME": "bash"}, {"SLURM_JOB_NAME": "interactive"},
                                       {"SLURM_NTASKS": "1"}])
def test_slurm_not_detected_for_interactive_or_single_task(launch_env: pytest.MonkeyPatch,
                                                           overrides: dict[str, str]) -> None:
    _set(launch_env, {**SLURM, **overrides})
    assert not SLURMEnvironment.detect()
    assert not processes_launched_externally()


@pytest.mark.parametrize(("nodelist", "expected"), [
    ("node[1-3,5]", "node1"),
    ("node[01-03]", "node01"),
    ("gpu[07-08,12],cpu1", "gpu07"),
    ("alpha,beta", "alpha"),
    ("single", "single"),
    ("rack[2-3]-n[5,9]", "rack2-n5"),
    ("node[4,1-2]", "node4"),
])
def test_first_host_of_nodelist(nodelist: str, expected: str) -> None:
    assert first_host(nodelist) == expected


def test_empty_nodelist_says_what_to_set() -> None:
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        first_host("  ")


def test_malformed_variable_is_named(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, {**TORCHRUN, "RANK": "five"})
    with pytest.raises(ValueError, match="RANK='five'"):
        _ = TorchElasticEnvironment().global_rank


def test_missing_variable_is_named(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    with pytest.raises(KeyError, match="SLURM_LOCALID"):
        _ = SLURMEnvironment().local_rank
