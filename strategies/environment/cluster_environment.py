"""What every cluster environment answers: this process's ranks, the job's shape as its launcher
reports it, and where the rendezvous is. Values are read from `os.environ` on every access, so one
object works in the parent before launch and in the worker after the launcher set the variables."""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass

import torch.distributed as dist


def env_int(key: str, default: int | None = None) -> int:
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


@dataclass(frozen=True)
class LaunchShape:
    """How many processes the launcher started, as it reports them. `None` means "not reported";
    the `*_source` strings name the variables (for error messages) and `fix_*` the launcher's own
    flag, so a message can say exactly what to change on the launcher's side."""

    launcher: str
    world_size: int
    world_source: str
    per_node: int | None = None
    per_node_source: str = ""
    num_nodes: int | None = None
    num_nodes_source: str = ""
    fix_per_node: str = ""
    fix_num_nodes: str = ""


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
        return env_int("MASTER_PORT")

    def launch_shape(self) -> LaunchShape:
        """What the launcher says about the job's size (only the world size by default)."""
        return LaunchShape(type(self).__name__, self.world_size, f"world_size={self.world_size}")

    @property
    def restart_count(self) -> int:
        """How often the launcher restarted the group after a failure (torch elastic's variable)."""
        return env_int("TORCHELASTIC_RESTART_COUNT", 0)

    def rendezvous_store(self) -> dist.Store | None:
        """A store this process already holds for the group's rendezvous; None: the launcher's
        variables say where it is (env://, or torch elastic's agent store)."""
        return None
