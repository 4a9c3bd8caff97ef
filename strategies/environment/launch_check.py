"""The pre-flight check: the launch's shape against the Trainer's `devices`/`num_nodes`.

It runs before `init_process_group`, because a mismatch found there is a rendezvous that never
completes; the message names both sides and what to change on each.
"""

from __future__ import annotations

import os

import torch

from strategies.environment.cluster_environment import ClusterEnvironment, LaunchShape
from strategies.rank_zero import rank_prefixed_message


def check_launch_matches(environment: ClusterEnvironment, devices: int, num_nodes: int,
                         accelerator: str = "cpu") -> None:
    """Raise ValueError when the launch and the Trainer disagree about the job's shape.

    Called before `init_process_group`: with a wrong world size the rendezvous would wait for
    ranks that never come, and with a wrong per-node split ranks would pick wrong devices. The
    message names both sides and what to change on each; every rank raises the same error.
    """
    shape = environment.launch_shape()
    problems = _shape_problems(shape, devices, num_nodes)
    if accelerator == "cuda":
        problems += _device_problems(environment, shape, devices)
    if problems:
        raise ValueError(rank_prefixed_message(
            "; ".join(problems) + ". Trainer(devices=..., num_nodes=...) must describe the launch: processes per "
            "node and nodes (checked before the process group starts, where a mismatch would hang).",
            _safe_rank(environment)))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith("s") else "s")


def _shape_problems(shape: LaunchShape, devices: int, num_nodes: int) -> list[str]:
    problems = []
    if shape.per_node is not None and shape.per_node != devices:
        problems.append(f"the launcher started {_plural(shape.per_node, 'process')} per node ({shape.launcher}, "
                        f"{shape.per_node_source}) but the Trainer has devices={devices}: set devices="
                        f"{shape.per_node} (CLI: trainer.devices={shape.per_node}) or launch with "
                        f"{shape.fix_per_node}={devices}")
    if shape.num_nodes is not None and shape.num_nodes != num_nodes:
        problems.append(f"the launcher spans {_plural(shape.num_nodes, 'node')} ({shape.launcher}, "
                        f"{shape.num_nodes_source}) but the Trainer has num_nodes={num_nodes}: set num_nodes="
                        f"{shape.num_nodes} (CLI: trainer.num_nodes={shape.num_nodes}) or launch with "
                        f"{shape.fix_num_nodes}={num_nodes}")
    expected = devices * num_nodes
    if shape.world_size != expected and not problems:  # a per-node/node mismatch already explains it
        problems.append(f"the launcher started {_plural(shape.world_size, 'process')} ({shape.launcher}, "
                        f"{shape.world_source}) but the Trainer has devices={devices} x num_nodes={num_nodes} = "
                        f"{expected}: make devices x num_nodes equal the number of processes launched")
    return problems


def _device_problems(environment: ClusterEnvironment, shape: LaunchShape, devices: int) -> list[str]:
    visible = torch.cuda.device_count()
    local_rank = _safe_local_rank(environment)
    if devices <= visible and (local_rank is None or local_rank < visible):
        return []
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [f"this node sees {visible} GPU(s) (CUDA_VISIBLE_DEVICES={mask!r}) but the Trainer has devices={devices}"
            f"{'' if local_rank is None else f' and this is LOCAL_RANK={local_rank}'}: start at most {visible} "
            f"process(es) per node ({shape.fix_per_node or 'devices'}={visible}) or make more GPUs visible"]


def _safe_rank(environment: ClusterEnvironment) -> int | None:
    try:
        return environment.global_rank
    except (KeyError, ValueError):
        return None


def _safe_local_rank(environment: ClusterEnvironment) -> int | None:
    try:
        return environment.local_rank
    except (KeyError, ValueError):
        return None
