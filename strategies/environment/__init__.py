"""Where a process learns its place in the job: ranks, world size and the rendezvous address.

An environment only *reports*; it never starts processes (that is `launcher.py`) and never
initialises the process group (that is `process_group.py`). One module per kind of launcher
(`local`, `torchelastic`, `slurm`), the interface they share (`cluster_environment`), which one
describes this process (`detection`), and the pre-flight check of the launch's shape against the
Trainer's (`launch_check`).
"""

from __future__ import annotations

from strategies.environment.cluster_environment import ClusterEnvironment, LaunchShape
from strategies.environment.detection import (detect_environment, processes_launched_externally,
                                              processes_outlive_stages)
from strategies.environment.launch_check import check_launch_matches
from strategies.environment.local import (GROUP_GENERATION_VARIABLE, LOCAL_LAUNCH_MARKER, LaunchingProcessEnvironment,
                                          LocalEnvironment, rendezvous_prefix, use_launching_process_rank)
from strategies.environment.slurm import (SLURM_INTERACTIVE_JOB_NAMES, SLURMEnvironment, expand_tasks_per_node,
                                          first_host)
from strategies.environment.torchelastic import TorchElasticEnvironment

__all__ = ["GROUP_GENERATION_VARIABLE", "LOCAL_LAUNCH_MARKER", "SLURM_INTERACTIVE_JOB_NAMES", "ClusterEnvironment", "LaunchShape",
           "LaunchingProcessEnvironment", "LocalEnvironment", "SLURMEnvironment", "TorchElasticEnvironment",
           "check_launch_matches", "detect_environment", "expand_tasks_per_node", "first_host",
           "processes_launched_externally", "processes_outlive_stages", "rendezvous_prefix",
           "use_launching_process_rank"]
