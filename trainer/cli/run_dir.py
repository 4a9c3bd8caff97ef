"""Where a `ddp-train` run writes: the run directory's name (Hydra's `ddp_run_name` resolver) and
the directory itself once Hydra has made it."""

from __future__ import annotations

import hashlib
import os
import socket
import sys

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from strategies.environment import (SLURM_INTERACTIVE_JOB_NAMES, LocalEnvironment, SLURMEnvironment,
                                    TorchElasticEnvironment)
from strategies.slurm_requeue import slurm_job_id


def run_name(default: str) -> str:
    """The run directory's name. Under torchrun or srun every rank runs `ddp-train` itself and
    their clocks differ, so the launcher's job id names the directory they all share. A SLURM job
    keeps its id when requeued, so its run directory (and preemption checkpoint) is the same; in a
    batch script the command line names it too (interactive allocations keep the clock's name)."""
    if LocalEnvironment.detect():  # a worker of our own launcher (it never re-runs the CLI)
        return default
    if TorchElasticEnvironment.detect():
        run_id = os.environ["TORCHELASTIC_RUN_ID"]
        if run_id in ("", "none"):  # torchrun without --rdzv-id: one node's ranks share the agent
            run_id = f"{socket.gethostname()}-{os.getppid()}"
        return f"torchrun-{run_id}"
    if SLURMEnvironment.detect():
        step = os.environ.get("SLURM_STEP_ID")
        return f"slurm-{os.environ.get('SLURM_JOB_ID', 'job')}" + (f".{step}" if step else "")
    job = slurm_job_id()
    if job and os.environ.get("SLURM_JOB_NAME") not in SLURM_INTERACTIVE_JOB_NAMES:
        # A batch job whose script runs ddp-train (our launcher starts the ranks): a requeued job runs the
        # same command again and must find its checkpoint; two commands of one job get two directories.
        command = hashlib.sha1(" ".join(sys.argv[1:]).encode()).hexdigest()[:8]
        return f"slurm-{job}-{command}"
    return default


def output_dir(cfg: DictConfig) -> str:
    """The run's directory: Hydra's output dir (`paths.output_dir` may redirect it)."""
    configured = OmegaConf.select(cfg, "paths.output_dir", default=None)
    return str(configured) if configured else HydraConfig.get().runtime.output_dir
