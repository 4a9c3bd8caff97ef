"""Seeding: one call makes Python, NumPy and torch reproducible in this and spawned processes."""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import numpy as np
import torch

SEED_ENV = "PL_GLOBAL_SEED"  # Lightning's name: the sampler and spawned workers read it


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed every RNG and export the seed so spawned workers and DistributedSampler share it."""
    if seed is None:
        seed = int(os.environ.get(SEED_ENV, 0))
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r} ({type(seed).__name__}).")
    if not (0 <= seed < 2**32):
        raise ValueError(f"seed={seed} is out of range; expected 0 <= seed < 2**32.")
    os.environ[SEED_ENV] = str(seed)
    os.environ["PL_SEED_WORKERS"] = str(int(workers))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


def rng_states() -> dict[str, object]:
    """Every RNG state of this process, in checkpoint-safe (weights_only) form."""
    states: dict[str, object] = {
        "torch": torch.get_rng_state(),
        "python": _python_state_to_tensor(random.getstate()),
        "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
        "numpy_pos": int(np.random.get_state()[2]),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def gather_rng_states(all_gather: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, object]:
    """Every rank's RNG states, stacked along a leading rank dimension (a collective: all
    ranks call it). Resuming then gives each rank its own stream back, as if never stopped."""
    own = rng_states()
    gathered: dict[str, object] = {"per_rank": True, "numpy_pos": all_gather(torch.tensor([own["numpy_pos"]]))}
    for key in ("torch", "python", "numpy"):
        tensor = own[key]
        assert isinstance(tensor, torch.Tensor)
        gathered[key] = all_gather(tensor.to(torch.int64)).cpu()
    if "cuda" in own:
        gathered["cuda"] = own["cuda"]  # per device already; each rank restores its own device
    return gathered


def restore_rank_rng_states(states: dict[str, object], rank: int) -> None:
    """Restore this rank's slice of `gather_rng_states`; a checkpoint from a different world size
    gives ranks beyond the old world size the state of old rank 0."""
    if not states.get("per_rank"):
        restore_rng_states(states)
        return
    world = states["torch"].shape[0]  # type: ignore[attr-defined]
    index = rank if rank < world else 0
    restore_rng_states({
        "torch": states["torch"][index].to(torch.uint8),  # type: ignore[index]
        "python": states["python"][index],  # type: ignore[index]
        "numpy": states["numpy"][index],  # type: ignore[index]
        "numpy_pos": int(states["numpy_pos"][index]),  # type: ignore[index]
        **({"cuda": states["cuda"]} if "cuda" in states else {}),
    })


def restore_rng_states(states: dict[str, object]) -> None:
    if "torch" in states:
        torch.set_rng_state(states["torch"])  # type: ignore[arg-type]
    if "python" in states:
        random.setstate(_python_state_from_tensor(states["python"]))  # type: ignore[arg-type]
    if "numpy" in states:
        keys = states["numpy"].numpy().astype(np.uint32)  # type: ignore[attr-defined]
        np.random.set_state(("MT19937", keys, int(states.get("numpy_pos", 0)), 0, 0.0))  # type: ignore[arg-type]
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])  # type: ignore[arg-type]


def _python_state_to_tensor(state: tuple) -> torch.Tensor:
    version, internal, _gauss = state
    return torch.tensor([version, *internal], dtype=torch.int64)


def _python_state_from_tensor(tensor: torch.Tensor) -> tuple:
    values = [int(v) for v in tensor.tolist()]
    return (values[0], tuple(values[1:]), None)
