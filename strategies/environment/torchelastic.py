"""Processes started by torchrun / torch elastic: the elastic agent sets every variable per worker."""

from __future__ import annotations

import os

from typing_extensions import override

from strategies.environment.cluster_environment import ClusterEnvironment, LaunchShape, env_int

_TORCHELASTIC_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


class TorchElasticEnvironment(ClusterEnvironment):
    """torchrun / torch elastic: every variable is set per worker by the elastic agent."""

    creates_processes_externally = True

    @classmethod
    def detect(cls) -> bool:
        return all(key in os.environ for key in _TORCHELASTIC_REQUIRED)

    @property
    def world_size(self) -> int:
        return env_int("WORLD_SIZE")

    @property
    def global_rank(self) -> int:
        return env_int("RANK")

    @property
    def local_rank(self) -> int:
        return env_int("LOCAL_RANK")

    @property
    def node_rank(self) -> int:
        return env_int("GROUP_RANK", 0)

    @override
    def launch_shape(self) -> LaunchShape:
        """torchrun sets LOCAL_WORLD_SIZE (--nproc-per-node) and GROUP_WORLD_SIZE (nodes joined)."""
        per_node = env_int("LOCAL_WORLD_SIZE", 0) or None
        nodes = env_int("GROUP_WORLD_SIZE", 0) or None
        return LaunchShape("torchrun", self.world_size, f"WORLD_SIZE={self.world_size}",
                           per_node, f"LOCAL_WORLD_SIZE={per_node}", nodes, f"GROUP_WORLD_SIZE={nodes}",
                           fix_per_node="--nproc-per-node", fix_num_nodes="--nnodes")
