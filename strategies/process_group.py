"""Create and destroy the default process group for one worker.

The rendezvous is always `env://`: under torch elastic (torchrun or our launcher) the workers
must join the agent's TCP store as clients, which only the env handler knows how to do. When
no launcher set MASTER_ADDR/MASTER_PORT (SLURM, a single in-process rank) we set them from
the environment object and remove them again on destroy, so nothing leaks into the caller.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from strategies.environment import GROUP_GENERATION_VARIABLE, ClusterEnvironment, rendezvous_prefix
from strategies.hang_guard import LEDGER
from strategies.rank_zero import rank_prefixed_message

KNOWN_BACKENDS = ("gloo", "nccl", "mpi", "ucc")

_ARRIVED = "ddp_trainer/arrived"  # the rendezvous store's key of each rank that reached it
_ARRIVAL_POLL_S = 0.005
# MASTER_* variables this module set itself (and must remove on destroy).
_variables_we_set: list[str] = []
_groups_made = 0  # default groups this process made (a forked rank starts with its parent's count)


def validate_backend(backend: str | None) -> None:
    """Reject an unknown backend name before any worker starts."""
    if backend is None:
        return
    if not isinstance(backend, str):
        raise TypeError(f"process_group_backend={backend!r} must be a backend name or None.")
    registered = tuple(name for name in getattr(dist.Backend, "backend_list", KNOWN_BACKENDS) if name != "undefined")
    if backend.lower() not in registered:
        raise ValueError(f"process_group_backend={backend!r} is not one of {[None, *registered]} (None: gloo on "
                         "CPU, nccl on CUDA).")


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """The backend to use: explicit if given, else gloo on CPU and nccl on CUDA."""
    validate_backend(backend)
    if backend is None:
        return "nccl" if device.type == "cuda" else "gloo"
    if backend.lower() == "nccl" and device.type != "cuda":
        raise ValueError(f"process_group_backend='nccl' needs CUDA devices but the strategy runs on "
                         f"{device}; use process_group_backend='gloo' (or None) or accelerator='cuda'.")
    return backend.lower()


def init_process_group(environment: ClusterEnvironment, *, backend: str, device: torch.device,
                       timeout: timedelta) -> bool:
    """Pin the device and join the default group; return False if one already existed (not ours).

    Errors carry the rank so that, among N interleaved logs, the failing worker is obvious.
    """
    rank, world_size = environment.global_rank, environment.world_size
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise RuntimeError(rank_prefixed_message(
                f"a process group already exists with rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"but the environment says rank {rank} of {world_size}; destroy it first "
                f"(torch.distributed.destroy_process_group()).", rank))
        return False
    _export_rendezvous_address(environment)
    _name_the_next_group_as_fresh_processes_do()
    try:
        store = environment.rendezvous_store() or _attempt_store(environment, timeout)
        if store is not None:
            _wait_for_every_rank(store, rank, world_size, timeout)
        if store is None:
            dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size,
                                    timeout=timeout)
        else:
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        # Gloo's init returns on a rank once *its* connections are up; without this barrier a
        # fast rank could finish and close them while a peer is still connecting.
        dist.barrier(device_ids=[device.index or 0] if device.type == "cuda" else None)
        LEDGER.new_group()  # every rank counts this group's collectives and stages from zero
    except (RuntimeError, ValueError, TimeoutError) as error:
        destroy_process_group()  # half-initialised (the barrier failed) or not at all: leave nothing
        raise RuntimeError(rank_prefixed_message(
            f"could not initialise the process group (backend={backend!r}, init_method='env://', "
            f"MASTER_ADDR={environment.main_address}, MASTER_PORT={environment.main_port}, "
            f"world_size={world_size}, timeout={timeout}): {_first_line(error)}. Check that every rank was started "
            f"and can reach the address, or raise DDPStrategy(timeout=...).", rank)) from error
    global _groups_made
    _groups_made += 1
    return True


def groups_made() -> int:
    """How many default process groups this process has made: a stage that reuses its ranks' group
    (the next Trainer with the same world size, backend and timeout) leaves the count as it was."""
    return _groups_made


def _name_the_next_group_as_fresh_processes_do() -> None:
    """torch names a new default group after a counter that only a destroy resets; an init that failed
    (a peer never came) leaves it raised, so this process's next group would be "1" where fresh workers
    name theirs "0", and its rendezvous keys would never meet theirs. Without a default group no other
    group exists, so the counter belongs at zero (the launching process is rank 0 of one pool after
    another and lives through failed ones)."""
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and not dist.is_initialized() and getattr(world, "group_count", 0) != 0:
        world.group_count = 0


def _wait_for_every_rank(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
    """Announce this rank and wait, in Python, until every rank has announced itself. torch's own
    rendezvous waits inside C++, where nothing can interrupt it: the launching process, rank 0 of its
    workers, must stop waiting when a worker dies before it arrives (it failed to start, or to load
    the stage), and a wait here ends with the exception its watch raises into it."""
    store.set(f"{_ARRIVED}/{rank}", "1")
    keys = [f"{_ARRIVED}/{peer}" for peer in range(world_size)]
    deadline = time.monotonic() + timeout.total_seconds()
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [peer for peer, key in enumerate(keys) if not store.check([key])]
            raise TimeoutError(f"rank(s) {missing} did not arrive at the rendezvous within {timeout}")
        time.sleep(_ARRIVAL_POLL_S)


def restart_count() -> int:
    """How often the launcher restarted this group after a failure (torch elastic and our pool set it)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


def shared_store() -> dist.Store | None:
    """The rendezvous store every rank of the default group reaches; None outside a group of 2 or more."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return dist.distributed_c10d._get_default_store()


def _attempt_store(environment: ClusterEnvironment, timeout: timedelta) -> dist.Store | None:
    """Under torch elastic the workers rendezvous on the agent's store, which outlives a restart;
    torch's env:// handler adds no per-attempt prefix (it assumes a fresh store), so a restarted
    group can read the failed attempt's gloo addresses and never connect. Namespace the keys."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = restart_count()
    # The agent's store is where elastic points the workers, whatever the environment object says.
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), environment.world_size,
                           is_master=False, timeout=timeout)
    generation = int(os.environ.get(GROUP_GENERATION_VARIABLE, 0))  # our pool's workers: which of its groups
    return dist.PrefixStore(rendezvous_prefix(attempt, generation), client)


def _first_line(error: BaseException) -> str:
    """torch appends a C++ stack trace to some messages; the first line is the diagnosis."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def abort_or_destroy(collect_garbage: bool = True) -> None:
    """Leave the default group after a stage failed (its peers were killed or left): NCCL's
    communicators are aborted first, since a destroy would wait for work dead peers never finish;
    gloo's connections just close."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        with contextlib.suppress(Exception):
            dist.distributed_c10d._abort_process_group()
    with contextlib.suppress(Exception):
        destroy_process_group(collect_garbage)
    _forget_rendezvous_address()


def destroy_process_group(collect_garbage: bool = True) -> None:
    """Destroy the default group if there is one; safe to call any number of times.

    Finished work handles and futures can keep the backend alive; freed at interpreter exit, they
    would need the GIL from a C++ thread while Python is being torn down (SIGABRT): so garbage is
    collected here, unless the caller lives on and collects once before it exits (a full collection
    in a process that imported torch takes most of a second)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        if collect_garbage:
            gc.collect()
    _forget_rendezvous_address()


def _export_rendezvous_address(environment: ClusterEnvironment) -> None:
    for key, value in (("MASTER_ADDR", environment.main_address), ("MASTER_PORT", str(environment.main_port))):
        if key not in os.environ:
            os.environ[key] = value
            _variables_we_set.append(key)


def _forget_rendezvous_address() -> None:
    while _variables_we_set:
        os.environ.pop(_variables_we_set.pop(), None)
