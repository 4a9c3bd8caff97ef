"""One machine, processes started by us: the workers of our own launcher, a single in-process rank,
and the launching process itself while it runs global rank 0 of its workers."""

from __future__ import annotations

import os
import socket

import torch.distributed as dist
from typing_extensions import override

from strategies.environment.cluster_environment import ClusterEnvironment, env_int

# Set by our launcher inside each worker it starts, so the worker knows the torch-elastic
# variables it sees came from us and not from an outside torchrun.
LOCAL_LAUNCH_MARKER = "DDP_TRAINER_LOCAL_WORKER"
# Which process group of a shared pool a stage's ranks join (one pool serves many Trainers; a new
# backend or timeout makes a new group on the same store, under its own keys).
GROUP_GENERATION_VARIABLE = "DDP_TRAINER_GROUP_GENERATION"


def rendezvous_prefix(restart_count: int, generation: int = 0) -> str:
    """The keys one group's ranks meet under in a store that outlives groups (a restart, a new group)."""
    return f"ddp_trainer/attempt_{restart_count}" + (f"/group_{generation}" if generation else "")


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
        return env_int("WORLD_SIZE", self._default_world_size)

    @property
    def global_rank(self) -> int:
        return env_int("RANK", 0)

    @property
    def local_rank(self) -> int:
        return env_int("LOCAL_RANK", 0)

    @property
    def node_rank(self) -> int:
        return env_int("GROUP_RANK", 0)

    @property
    def main_port(self) -> int:
        """MASTER_PORT if a launcher set it, else one free port chosen once (single process)."""
        if "MASTER_PORT" in os.environ:
            return env_int("MASTER_PORT")
        if self._port is None:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                self._port = int(sock.getsockname()[1])
        return self._port


class LaunchingProcessEnvironment(ClusterEnvironment):
    """Global rank 0 of our own local launch, in the process that called `fit` (as in Lightning's
    `ddp`): the user's objects there are the ones that run. Ranks 1..N-1 are the worker pool's
    processes. The launcher installs it while a stage runs here (`use_launching_process_rank`; the
    strategy keeps it afterwards), so nothing is written into the user's `os.environ`; the rendezvous
    store is the pool's own, held only while the stage runs (`end_stage`)."""

    creates_processes_externally = False

    def __init__(self, world_size: int, store: dist.Store, restart_count: int = 0, generation: int = 0) -> None:
        self._world_size, self._restart_count = world_size, restart_count
        self._store: dist.Store | None = store
        self._generation, self._port = generation, int(store.port)  # type: ignore[attr-defined]

    @classmethod
    def detect(cls) -> bool:
        return _LaunchingProcess.environment is not None

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def main_port(self) -> int:
        return self._port

    @property
    def restart_count(self) -> int:
        return self._restart_count

    @override
    def rendezvous_store(self) -> dist.Store:
        if self._store is None:
            raise RuntimeError("this process's stage as rank 0 of its workers has ended: its rendezvous store is "
                               "gone (a new stage installs a new environment)")
        # The workers join under the same prefix (process_group._attempt_store): one per attempt.
        return dist.PrefixStore(rendezvous_prefix(self._restart_count, self._generation), self._store)

    def end_stage(self) -> None:
        """Let go of the pool's store: the strategy keeps this environment for the ranks it reports, and a
        rank forked for a later stage must not hold the last reference to a store whose server thread
        only this process has (freeing it there would wait forever for that thread)."""
        self._store = None


class _LaunchingProcess:
    environment: LaunchingProcessEnvironment | None = None


def use_launching_process_rank(environment: LaunchingProcessEnvironment | None) -> None:
    """Make this process global rank 0 of a local launch (None: no longer)."""
    _LaunchingProcess.environment = environment


def launching_process_environment() -> LaunchingProcessEnvironment | None:
    """This process's environment while it is global rank 0 of its own workers, else None."""
    return _LaunchingProcess.environment
