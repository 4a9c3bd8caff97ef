"""Which environment describes this process, and what that means for launching.

Detection order (`detect_environment`): the launching process while it is rank 0 of its own
workers, our own launcher's workers, then torchrun/torch elastic, then SLURM (srun), then a
plain local process.
"""

from __future__ import annotations

from strategies.environment.cluster_environment import ClusterEnvironment
from strategies.environment.local import LaunchingProcessEnvironment, LocalEnvironment, launching_process_environment
from strategies.environment.slurm import SLURMEnvironment
from strategies.environment.torchelastic import TorchElasticEnvironment


def processes_launched_externally() -> bool:
    """True under torchrun or srun: one process per rank exists already, so launch must not
    start more (inside our own workers this is False: they are ours)."""
    if LocalEnvironment.detect():
        return False
    return TorchElasticEnvironment.detect() or SLURMEnvironment.detect()


def processes_outlive_stages() -> bool:
    """True when this process is a rank that lives on for the next stage: one started by torchrun
    or srun, one of our own local workers (strategies/worker.py), or the launching process as rank 0
    of such workers (its end of their group lives until they stop)."""
    return LocalEnvironment.detect() or LaunchingProcessEnvironment.detect() or processes_launched_externally()


def detect_environment(default_world_size: int = 1) -> ClusterEnvironment:
    """The environment describing this process (see the module docstring for the order)."""
    launching_process = launching_process_environment()
    if launching_process is not None:
        return launching_process
    if LocalEnvironment.detect():
        return LocalEnvironment(default_world_size)
    if TorchElasticEnvironment.detect():
        return TorchElasticEnvironment()
    if SLURMEnvironment.detect():
        return SLURMEnvironment()
    return LocalEnvironment(default_world_size)
