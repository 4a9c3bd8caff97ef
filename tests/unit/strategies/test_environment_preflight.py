"""Pre-flight check: the launcher's shape (torchrun / SLURM variables) against Trainer(devices, num_nodes).

No processes: the variables are monkeypatched. A mismatch must raise a ValueError naming both
sides and the fix, before any process group exists (a mismatch found later would hang).
"""

from __future__ import annotations

import pytest

from strategies.environment import (LOCAL_LAUNCH_MARKER, LocalEnvironment, SLURMEnvironment, TorchElasticEnvironment,
                                    check_launch_matches, detect_environment, expand_tasks_per_node)

# Two nodes x one process: rank 1 of `torchrun --nnodes 2 --nproc-per-node 1`.
TORCHRUN = {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "r"}
# `sbatch --nodes 3 --ntasks-per-node 2` + `srun`: the task with SLURM_PROCID=5 on the third node.
SLURM = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "6", "SLURM_NODEID": "2",
         "SLURM_NNODES": "3", "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_NODELIST": "gpu[01-03]",
         "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "77"}


def _set(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for key, value in values.items():
        monkeypatch.setenv(key, value)


def test_torchrun_shape_that_matches_passes(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, TORCHRUN)
    environment = detect_environment()
    assert isinstance(environment, TorchElasticEnvironment)
    shape = environment.launch_shape()
    assert (shape.world_size, shape.per_node, shape.num_nodes) == (2, 1, 2)
    check_launch_matches(environment, devices=1, num_nodes=2)


def test_torchrun_per_node_mismatch_names_both_sides(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, TORCHRUN)
    with pytest.raises(ValueError) as caught:
        check_launch_matches(detect_environment(), devices=2, num_nodes=2)
    message = str(caught.value)
    assert message.startswith("[rank: 1] ")
    for part in ("LOCAL_WORLD_SIZE=1", "devices=2", "trainer.devices=1", "--nproc-per-node=2"):
        assert part in message, part
    assert "nodes" not in message.split(".")[0]  # the node count agrees, so it is not blamed


def test_torchrun_node_mismatch_even_when_world_size_agrees(launch_env: pytest.MonkeyPatch) -> None:
    """devices=2 x num_nodes=1 has the right world size (2) but the wrong split: a run that
    "works" here would put two ranks' data on what the user thinks is one node."""
    _set(launch_env, TORCHRUN)
    expected = r"spans 2 nodes \(torchrun, GROUP_WORLD_SIZE=2\).*trainer\.num_nodes=2.*--nnodes=1"
    with pytest.raises(ValueError, match=expected):
        check_launch_matches(detect_environment(), devices=2, num_nodes=1)


def test_world_size_alone_is_checked_when_the_split_is_unknown(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, {k: v for k, v in TORCHRUN.items() if k not in ("LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE")})
    expected = r"^\[rank: 1\] the launcher started 2 processes \(torchrun, WORLD_SIZE=2\).*= 4"
    with pytest.raises(ValueError, match=expected):
        check_launch_matches(detect_environment(), devices=2, num_nodes=2)


def test_slurm_detection_and_shape(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, SLURM)
    environment = detect_environment()
    assert isinstance(environment, SLURMEnvironment)
    assert (environment.world_size, environment.global_rank, environment.local_rank, environment.node_rank) == \
        (6, 5, 1, 2)
    assert environment.main_address == "gpu01"
    shape = environment.launch_shape()
    assert (shape.world_size, shape.per_node, shape.num_nodes) == (6, 2, 3)
    check_launch_matches(environment, devices=2, num_nodes=3)


@pytest.mark.parametrize(("devices", "num_nodes", "expected"), [
    (4, 3, r"2 processes per node \(srun, SLURM_TASKS_PER_NODE=2\(x3\)\).*--ntasks-per-node=4"),
    (2, 2, r"spans 3 nodes \(srun, SLURM_NNODES=3\).*trainer\.num_nodes=3.*--nodes=2"),
    (1, 6, r"per node.*devices=1.*; the launcher spans 3 nodes"),  # both wrong: both named, one message
])
def test_slurm_mismatches(launch_env: pytest.MonkeyPatch, devices: int, num_nodes: int, expected: str) -> None:
    _set(launch_env, SLURM)
    with pytest.raises(ValueError, match=expected):
        check_launch_matches(detect_environment(), devices=devices, num_nodes=num_nodes)


def test_slurm_step_variables_win_over_the_allocation(launch_env: pytest.MonkeyPatch) -> None:
    """An srun step smaller than the allocation: the step's variables describe the ranks."""
    _set(launch_env, {**SLURM, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_NODEID": "0",
               "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_NUM_NODES": "3"})
    check_launch_matches(detect_environment(), devices=2, num_nodes=1)


def test_slurm_uneven_tasks_per_node_uses_this_node(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, {**SLURM, "SLURM_NTASKS": "5", "SLURM_TASKS_PER_NODE": "2(x2),1", "SLURM_PROCID": "4"})
    with pytest.raises(ValueError, match=r"started 1 process per node \(srun"):
        check_launch_matches(detect_environment(), devices=2, num_nodes=3)


def test_slurm_without_srun_tasks_is_not_an_external_launch(launch_env: pytest.MonkeyPatch) -> None:
    """One task (e.g. `sbatch` running python directly): our own launcher starts the processes."""
    _set(launch_env, {**SLURM, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"})
    assert isinstance(detect_environment(default_world_size=2), LocalEnvironment)
    check_launch_matches(detect_environment(default_world_size=2), devices=2, num_nodes=1)


@pytest.mark.parametrize(("value", "expected"), [("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x2),1", [2, 2, 1]),
                                                 (" 3 , 1(x2)", [3, 1, 1])])
def test_expand_tasks_per_node(value: str, expected: list[int]) -> None:
    assert expand_tasks_per_node(value) == expected


def test_malformed_tasks_per_node_is_named() -> None:
    with pytest.raises(ValueError, match=r"'2\[x3\]'"):
        expand_tasks_per_node("2[x3]")


def test_cuda_devices_beyond_visible_gpus(launch_env: pytest.MonkeyPatch) -> None:
    _set(launch_env, TORCHRUN)
    launch_env.setattr("torch.cuda.device_count", lambda: 0)
    with pytest.raises(ValueError, match=r"sees 0 GPU\(s\).*--nproc-per-node=0"):
        check_launch_matches(detect_environment(), devices=1, num_nodes=2, accelerator="cuda")
