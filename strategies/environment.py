"""Where a process learns its place in the job: ranks, world size and the rendezvous address.

An environment only *reports*; it never starts processes (that is `launcher.py`) and never
initialises the process group (that is `process_group.py`). Values are read from
`os.environ` on every access, so one object works in the parent before launch and in the
worker after the launcher has set the variables.

Detection order (`detect_environment`): our own launcher's workers, then torchrun/torch
elastic, then SLURM (srun), then a plain local process.
"""

from __future__ import annotations

import abc
import os
import re
import socket

# Set by our launcher inside each worker it starts, so the worker knows the torch-elastic
# variables it sees came from us and not from an outside torchrun.
LOCAL_LAUNCH_MARKER = "DDP_TRAINER_LOCAL_WORKER"

_TORCHELASTIC_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
_SLURM_INTERACTIVE_JOB_NAMES = ("bash", "interactive")


def _env_int(key: str, default: int | None = None) -> int:
    """Read an integer variable, naming it when it is missing or malformed."""
    raw = os.environ.get(key)
    if raw is None:
        if default is None:
            raise KeyError(f"Environment variable {key} is not set; the launcher that started this process "
                           f"should set it (torchrun, srun or ddp-trainer's own launcher).")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"Environment variable {key}={raw!r} is not an integer.") from None


class ClusterEnvironment(abc.ABC):
    """The ranks and rendezvous address of this process, as the launcher reported them."""

    #: True when processes were created outside of us (torchrun, srun): launch is a pass-through.
    creates_processes_externally: bool = False

    @classmethod
    @abc.abstractmethod
    def detect(cls) -> bool:
        """Whether the current process runs under this kind of launcher."""

    @property
    @abc.abstractmethod
    def world_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def global_rank(self) -> int: ...

    @property
    @abc.abstractmethod
    def local_rank(self) -> int: ...

    @property
    @abc.abstractmethod
    def node_rank(self) -> int: ...

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return _env_int("MASTER_PORT")


class TorchElasticEnvironment(ClusterEnvironment):
    """torchrun / torch elastic: every variable is set per worker by the elastic agent."""

    creates_processes_externally = True

    @classmethod
    def detect(cls) -> bool:
        return all(key in os.environ for key in _TORCHELASTIC_REQUIRED)

    @property
    def world_size(self) -> int:
        return _env_int("WORLD_SIZE")

    @property
    def global_rank(self) -> int:
        return _env_int("RANK")

    @property
    def local_rank(self) -> int:
        return _env_int("LOCAL_RANK")

    @property
    def node_rank(self) -> int:
        return _env_int("GROUP_RANK", 0)


class LocalEnvironment(ClusterEnvironment):
    """One machine, processes started by our launcher (or a single in-process rank).

    Our launcher is torch elastic, so its workers see the same variables torchrun sets; a
    process with none of them is rank 0 of `default_world_size` (a single process when 1).
    """

    creates_processes_externally = False

    def __init__(self, default_world_size: int = 1) -> None:
        self._default_world_size = default_world_size
        self._port: int | None = None

    @classmethod
    def detect(cls) -> bool:
        return os.environ.get(LOCAL_LAUNCH_MARKER) == "1"

    @property
    def world_size(self) -> int:
        return _env_int("WORLD_SIZE", self._default_world_size)

    @property
    def global_rank(self) -> int:
        return _env_int("RANK", 0)

    @property
    def local_rank(self) -> int:
        return _env_int("LOCAL_RANK", 0)

    @property
    def node_rank(self) -> int:
        return _env_int("GROUP_RANK", 0)

    @property
    def main_port(self) -> int:
        """MASTER_PORT if a launcher set it, else one free port chosen once (single process)."""
        if "MASTER_PORT" in os.environ:
            return _env_int("MASTER_PORT")
        if self._port is None:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                self._port = int(sock.getsockname()[1])
        return self._port


class SLURMEnvironment(ClusterEnvironment):
    """Processes started by `srun` (one task per device). Interactive `bash` jobs do not count,
    since their single task is a shell, not a rank."""

    creates_processes_externally = True

    @classmethod
    def detect(cls) -> bool:
        if "SLURM_PROCID" not in os.environ:
            return False
        if os.environ.get("SLURM_JOB_NAME") in _SLURM_INTERACTIVE_JOB_NAMES:
            return False
        return _env_int("SLURM_NTASKS", 1) > 1

    @property
    def world_size(self) -> int:
        return _env_int("SLURM_NTASKS")

    @property
    def global_rank(self) -> int:
        return _env_int("SLURM_PROCID")

    @property
    def local_rank(self) -> int:
        return _env_int("SLURM_LOCALID")

    @property
    def node_rank(self) -> int:
        return _env_int("SLURM_NODEID")

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
            return _env_int("MASTER_PORT")
        return 15000 + _env_int("SLURM_JOB_ID", 0) % 10000


def first_host(nodelist: str) -> str:
    """The first host of a SLURM nodelist: "node[1-3,5],gpu7" -> "node1" (padding kept)."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise ValueError("SLURM_NODELIST is empty; set MASTER_ADDR to the first node's address.")
    first = re.split(r",(?![^\[]*\])", nodelist)[0]
    return re.sub(r"\[([^\]]*)\]", lambda match: match.group(1).split(",")[0].split("-")[0], first)


def processes_launched_externally() -> bool:
    """True under torchrun or srun: one process per rank exists already, so launch must not
    start more (inside our own workers this is False: they are ours)."""
    if LocalEnvironment.detect():
        return False
    return TorchElasticEnvironment.detect() or SLURMEnvironment.detect()


def detect_environment(default_world_size: int = 1) -> ClusterEnvironment:
    """The environment describing this process (see the module docstring for the order)."""
    if LocalEnvironment.detect():
        return LocalEnvironment(default_world_size)
    if TorchElasticEnvironment.detect():
        return TorchElasticEnvironment()
    if SLURMEnvironment.detect():
        return SLURMEnvironment()
    return LocalEnvironment(default_world_size)
