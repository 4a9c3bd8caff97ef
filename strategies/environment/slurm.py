"""Processes started by SLURM's `srun`, one task per device; and SLURM's compressed host and
task-count notations, which the environment must expand."""

from __future__ import annotations

import os
import re

from typing_extensions import override

from strategies.environment.cluster_environment import ClusterEnvironment, LaunchShape, env_int

SLURM_INTERACTIVE_JOB_NAMES = ("bash", "interactive")


class SLURMEnvironment(ClusterEnvironment):
    """Processes started by `srun` (one task per device). Interactive `bash` jobs do not count,
    since their single task is a shell, not a rank."""

    creates_processes_externally = True

    @classmethod
    def detect(cls) -> bool:
        if "SLURM_PROCID" not in os.environ:
            return False
        if os.environ.get("SLURM_JOB_NAME") in SLURM_INTERACTIVE_JOB_NAMES:
            return False
        return env_int("SLURM_NTASKS", 1) > 1

    @property
    def world_size(self) -> int:
        return env_int("SLURM_NTASKS")

    @property
    def global_rank(self) -> int:
        return env_int("SLURM_PROCID")

    @property
    def local_rank(self) -> int:
        return env_int("SLURM_LOCALID")

    @property
    def node_rank(self) -> int:
        return env_int("SLURM_NODEID")

    @override
    def launch_shape(self) -> LaunchShape:
        """srun's step variables first (they describe this step), the allocation's as a fallback."""
        nodes_key = _first_set("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
        tasks_key = _first_set("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
        nodes = env_int(nodes_key) if nodes_key else None
        per_node = None
        if tasks_key:
            counts = expand_tasks_per_node(os.environ[tasks_key])
            node = env_int("SLURM_NODEID", 0)
            per_node = counts[node] if node < len(counts) else counts[-1]
        return LaunchShape("srun", self.world_size, f"SLURM_NTASKS={self.world_size}",
                           per_node, f"{tasks_key}={os.environ.get(tasks_key or '', '')}",
                           nodes, f"{nodes_key}={nodes}", fix_per_node="--ntasks-per-node", fix_num_nodes="--nodes")

    @property
    def main_address(self) -> str:
        if "MASTER_ADDR" in os.environ:
            return os.environ["MASTER_ADDR"]
        nodelist = os.environ.get("SLURM_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
        return first_host(nodelist)

    @property
    def main_port(self) -> int:
        """MASTER_PORT if set; otherwise derived from the job id so every task agrees on it."""
        if "MASTER_PORT" in os.environ:
            return env_int("MASTER_PORT")
        return 15000 + env_int("SLURM_JOB_ID", 0) % 10000


def first_host(nodelist: str) -> str:
    """The first host of a SLURM nodelist: "node[1-3,5],gpu7" -> "node1" (padding kept)."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise ValueError("SLURM_NODELIST is empty; set MASTER_ADDR to the first node's address.")
    first = re.split(r",(?![^\[]*\])", nodelist)[0]
    return re.sub(r"\[([^\]]*)\]", lambda match: match.group(1).split(",")[0].split("-")[0], first)


def _first_set(*keys: str) -> str | None:
    return next((key for key in keys if os.environ.get(key)), None)


def expand_tasks_per_node(value: str) -> list[int]:
    """SLURM's compressed per-node task counts, one entry per node: "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ValueError(f"Cannot parse SLURM tasks per node {value!r}: expected a list like '2(x3),1'.")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts
