"""Where a process learns its place in the job: ranks, world size and the rendezvous address.

An environment only *reports*; it never starts processes (that is `launcher.py`) and never
initialises the process group (that is `process_group.py`). Values are read from
`os.environ` on every access, so one object works in the parent before launch and in the
worker after the launcher has set the variables.

Detection order (`detect_environment`): the launching process while it is rank 0 of its own
workers, our own launcher's workers, then torchrun/torch elastic, then SLURM (srun), then a
plain local process.

`check_launch_matches` is the pre-flight check: it compares the shape the launcher reports
(processes in total, per node, nodes) with the Trainer's `devices`/`num_nodes` *before*
`init_process_group`, because a mismatch found there is a rendezvous that never completes.
"""

from __future__ import annotations

import abc
import os
import re
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
from typing_extensions import override

from strategies.rank_zero import rank_prefixed_message

# Set by our launcher inside each worker it starts, so the worker knows the torch-elastic
# variables it sees came from us and not from an outside torchrun.
LOCAL_LAUNCH_MARKER = "DDP_TRAINER_LOCAL_WORKER"

_TORCHELASTIC_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
SLURM_INTERACTIVE_JOB_NAMES = ("bash", "interactive")


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
        return _env_int("MASTER_PORT")

    def launch_shape(self) -> LaunchShape:
        """What the launcher says about the job's size (only the world size by default)."""
        return LaunchShape(type(self).__name__, self.world_size, f"world_size={self.world_size}")

    @property
    def restart_count(self) -> int:
        """How often the launcher restarted the group after a failure (torch elastic's variable)."""
        return _env_int("TORCHELASTIC_RESTART_COUNT", 0)

    def rendezvous_store(self) -> dist.Store | None:
        """A store this process already holds for the group's rendezvous; None: the launcher's
        variables say where it is (env://, or torch elastic's agent store)."""
        return None


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

    @override
    def launch_shape(self) -> LaunchShape:
        """torchrun sets LOCAL_WORLD_SIZE (--nproc-per-node) and GROUP_WORLD_SIZE (nodes joined)."""
        per_node = _env_int("LOCAL_WORLD_SIZE", 0) or None
        nodes = _env_int("GROUP_WORLD_SIZE", 0) or None
        return LaunchShape("torchrun", self.world_size, f"WORLD_SIZE={self.world_size}",
                           per_node, f"LOCAL_WORLD_SIZE={per_node}", nodes, f"GROUP_WORLD_SIZE={nodes}",
                           fix_per_node="--nproc-per-node", fix_num_nodes="--nnodes")


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


class LaunchingProcessEnvironment(ClusterEnvironment):
    """Global rank 0 of our own local launch, in the process that called `fit` (as in Lightning's
    `ddp`): the user's objects there are the ones that run. Ranks 1..N-1 are the worker pool's
    processes. The launcher installs it while a stage runs here (`use_launching_process_rank`; the
    strategy keeps it afterwards), so nothing is written into the user's `os.environ`; the rendezvous
    store is the pool's own."""

    creates_processes_externally = False

    def __init__(self, world_size: int, store: dist.Store, restart_count: int = 0) -> None:
        self._world_size, self._store, self._restart_count = world_size, store, restart_count

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
        return int(self._store.port)  # type: ignore[attr-defined]

    @property
    def restart_count(self) -> int:
        return self._restart_count

    @override
    def rendezvous_store(self) -> dist.Store:
        # The workers join under the same prefix (process_group._attempt_store): one per attempt.
        return dist.PrefixStore(f"ddp_trainer/attempt_{self._restart_count}", self._store)


class _LaunchingProcess:
    environment: LaunchingProcessEnvironment | None = None


def use_launching_process_rank(environment: LaunchingProcessEnvironment | None) -> None:
    """Make this process global rank 0 of a local launch (None: no longer)."""
    _LaunchingProcess.environment = environment


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

    @override
    def launch_shape(self) -> LaunchShape:
        """srun's step variables first (they describe this step), the allocation's as a fallback."""
        nodes_key = _first_set("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
        tasks_key = _first_set("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
        nodes = _env_int(nodes_key) if nodes_key else None
        per_node = None
        if tasks_key:
            counts = expand_tasks_per_node(os.environ[tasks_key])
            node = _env_int("SLURM_NODEID", 0)
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
            return _env_int("MASTER_PORT")
        return 15000 + _env_int("SLURM_JOB_ID", 0) % 10000


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
    if _LaunchingProcess.environment is not None:
        return _LaunchingProcess.environment
    if LocalEnvironment.detect():
        return LocalEnvironment(default_world_size)
    if TorchElasticEnvironment.detect():
        return TorchElasticEnvironment()
    if SLURMEnvironment.detect():
        return SLURMEnvironment()
    return LocalEnvironment(default_world_size)
