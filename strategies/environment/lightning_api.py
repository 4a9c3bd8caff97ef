"""`strategy.cluster_environment` as Lightning's programs read it.

Lightning's `ClusterEnvironment` answers ranks through methods (`world_size()`, `global_rank()`, ...)
and the rendezvous through properties (`main_address`, `main_port`, `creates_processes_externally`);
ours answers ranks through properties. This read-only view gives a program Lightning's spelling of
our environment's answers; it holds nothing of its own.
"""

from __future__ import annotations

from strategies.environment.cluster_environment import ClusterEnvironment


class LightningEnvironmentView:
    """Our `ClusterEnvironment`, asked with Lightning's `ClusterEnvironment` API."""

    def __init__(self, environment: ClusterEnvironment, launched: bool = False) -> None:
        self.environment = environment
        self.launched = launched

    @property
    def creates_processes_externally(self) -> bool:
        """Lightning's answer: True once the processes exist, whoever made them (its launcher marks every rank,
        rank 0 too, as it starts them); before our own launcher ran, False; under torchrun or srun, True."""
        return bool(self.environment.creates_processes_externally) or self.launched

    @property
    def main_address(self) -> str:
        return self.environment.main_address

    @property
    def main_port(self) -> int:
        return self.environment.main_port

    def world_size(self) -> int:
        return self.environment.world_size

    def global_rank(self) -> int:
        return self.environment.global_rank

    def local_rank(self) -> int:
        return self.environment.local_rank

    def node_rank(self) -> int:
        return self.environment.node_rank

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.environment).__name__})"
