"""Rank-aware printing helpers shared by strategies and the trainer."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def current_global_rank() -> int:
    """The global rank from the launcher's environment (0 outside any launcher)."""
    for key in ("RANK", "SLURM_PROCID", "PMI_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def rank_zero_only(fn: Callable[..., T]) -> Callable[..., T | None]:
    """Run `fn` on global rank 0 only; other ranks get None."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> T | None:
        if current_global_rank() == 0:
            return fn(*args, **kwargs)
        return None

    return wrapped


def rank_prefixed_message(message: str, rank: int | None = None) -> str:
    """Prefix a message with the rank that produced it, so multi-process logs stay readable."""
    rank = current_global_rank() if rank is None else rank
    return f"[rank: {rank}] {message}"


@rank_zero_only
def rank_zero_info(message: str) -> None:
    print(message, flush=True)


@rank_zero_only
def rank_zero_warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)
