"""Seeding: one call makes Python, NumPy and torch reproducible in this and spawned processes."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

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


def reset_seed() -> None:
    """Seed again with the seed `seed_everything` last set (in this process, or in the launching one:
    the workers get its environment); nothing when none was set. Lightning's DDP does this on every
    rank as each stage starts, so every stage of a seeded script starts from the same random state
    on every rank, whatever the script drew before it."""
    if SEED_ENV in os.environ:
        seed_everything(int(os.environ[SEED_ENV]), workers=os.environ.get("PL_SEED_WORKERS") == "1")


def rng_states(device_type: str = "cpu") -> dict[str, object]:
    """Every RNG state of this process, in checkpoint-safe (weights_only) form; on "cuda" also
    the generator of this process's own GPU (one device per process: the current one)."""
    numpy_state: Any = np.random.get_state()  # ("MT19937", keys, position, ...): the legacy tuple
    states: dict[str, object] = {
        "torch": torch.get_rng_state(),
        "python": _python_state_to_tensor(random.getstate()),
        "numpy": torch.from_numpy(numpy_state[1].astype(np.int64)),
        "numpy_pos": int(numpy_state[2]),
    }
    if device_type == "cuda":
        states["cuda_device"] = torch.cuda.get_rng_state()
    return states


def gather_rng_states(all_gather: Callable[[torch.Tensor], torch.Tensor],
                      device_type: str = "cpu") -> dict[str, object]:
    """Every rank's RNG states, stacked along a leading rank dimension (a collective: all
    ranks call it). Resuming then gives each rank its own stream back, as if never stopped:
    on GPUs too, where each rank's dropout draws from its own device's generator."""
    own = rng_states(device_type)
    gathered: dict[str, object] = {"per_rank": True, "numpy_pos": all_gather(torch.tensor([own["numpy_pos"]]))}
    for key in ("torch", "python", "numpy", *(("cuda_device",) if "cuda_device" in own else ())):
        tensor = own[key]
        assert isinstance(tensor, torch.Tensor)
        gathered[key] = all_gather(tensor.to(torch.int64)).cpu()
    return gathered


def restore_rank_rng_states(states: dict[str, object], rank: int, device_type: str = "cpu") -> None:
    """Restore this rank's slice of `gather_rng_states`; a checkpoint from a different world size
    gives ranks beyond the old world size the state of old rank 0. `device_type` is the resuming
    run's: a GPU generator is restored only into a run on a GPU."""
    if not states.get("per_rank"):
        restore_rng_states(states, device_type)
        return
    world = states["torch"].shape[0]  # type: ignore[attr-defined]
    index = rank if rank < world else 0
    own: dict[str, object] = {key: states[key][index]  # type: ignore[index]
                              for key in ("torch", "python", "numpy", "cuda_device") if key in states}
    own["numpy_pos"] = int(states["numpy_pos"][index])  # type: ignore[index]
    if "cuda" in states:
        own["cuda"] = states["cuda"]  # older checkpoints: rank 0's list, not stacked per rank
    restore_rng_states(own, device_type)


def restore_rng_states(states: dict[str, object], device_type: str = "cpu") -> None:
    """The generators take CPU byte tensors: the Trainer loads checkpoints onto the CPU, but a
    user's CheckpointIO may honour another map_location. Resuming on the CPU never creates a CUDA
    context; checkpoints from before per-rank GPU states hold rank 0's list of every device's
    state (key "cuda"), of which this process takes its current device's."""
    if "torch" in states:
        torch.set_rng_state(_cpu_bytes(states["torch"]))
    if "python" in states:
        random.setstate(_python_state_from_tensor(states["python"]))  # type: ignore[arg-type]
    if "numpy" in states:
        keys = states["numpy"].cpu().numpy().astype(np.uint32)  # type: ignore[attr-defined]
        position: Any = states.get("numpy_pos", 0)
        np.random.set_state(("MT19937", keys, int(position), 0, 0.0))
    if device_type != "cuda" or not torch.cuda.is_available():
        return
    if "cuda_device" in states:
        torch.cuda.set_rng_state(_cpu_bytes(states["cuda_device"]))  # this rank's own (current) device
        return
    every_device = states.get("cuda")
    if isinstance(every_device, (list, tuple)) and torch.cuda.current_device() < len(every_device):
        torch.cuda.set_rng_state(_cpu_bytes(every_device[torch.cuda.current_device()]))


def _cpu_bytes(state: object) -> torch.Tensor:
    assert isinstance(state, torch.Tensor)
    return state.detach().to(device="cpu", dtype=torch.uint8)


def _python_state_to_tensor(state: tuple) -> torch.Tensor:
    version, internal, _gauss = state
    return torch.tensor([version, *internal], dtype=torch.int64)


def _python_state_from_tensor(tensor: torch.Tensor) -> tuple:
    values = [int(v) for v in tensor.tolist()]
    return (values[0], tuple(values[1:]), None)
