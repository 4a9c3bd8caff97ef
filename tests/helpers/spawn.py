"""Run a function on N real gloo ranks (CPU) and collect every rank's return value.

Each rank is a fresh spawned process with `torch.set_num_threads(1)`, a process group on
127.0.0.1 and a free port. A rank that raises makes `run_on_ranks` raise `RankFailed`
carrying that rank's traceback; the others are terminated, so nothing hangs or lingers.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import socket
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from strategies.process_group import destroy_process_group


class RankFailed(RuntimeError):
    """A rank raised; the message holds its rank and traceback."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, out_dir: str) -> None:
    faulthandler.enable()  # a C++ abort (SIGABRT/SIGSEGV) still prints every thread's Python stack
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    out = Path(out_dir) / f"rank{rank}.pkl"
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
        result: Any = ("ok", fn(rank, world_size, *args))
        # A rank that tore down right after its last collective could close connections its
        # peer still reads from (gloo then aborts the peer): wait for everyone first.
        dist.barrier()
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        result = ("error", traceback.format_exc())
    finally:
        destroy_process_group()  # the product's: it also frees lingering work handles before exit
    out.write_bytes(pickle.dumps(result))


def run_on_ranks(fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout: float = 120) -> list[Any]:
    """Call `fn(rank, world_size, *args)` on every rank; return the results ordered by rank.

    `fn` must be importable (defined at module level), as with any spawned process.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(_worker, args=(world_size, free_port(), fn, args, out_dir),
                                     nprocs=world_size, join=False, start_method="spawn")
        try:
            _join_all(context, timeout)
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(5)
        return _collect(Path(out_dir), world_size)


def _join_all(context: Any, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not context.join(timeout=0.5):
        if time.monotonic() > deadline:
            raise RankFailed(f"ranks did not finish within {timeout}s (hang?)")


def _collect(out_dir: Path, world_size: int) -> list[Any]:
    results, failures = [], []
    for rank in range(world_size):
        path = out_dir / f"rank{rank}.pkl"
        if not path.exists():
            failures.append(f"rank {rank} exited without a result")
            continue
        status, value = pickle.loads(path.read_bytes())
        if status == "error":
            failures.append(f"rank {rank} failed:\n{value}")
        results.append(value)
    if failures:
        raise RankFailed("\n".join(failures))
    return results
