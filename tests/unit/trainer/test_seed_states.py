"""RNG states in checkpoints, the GPU parts included, checked on the CPU: torch.cuda's
generator calls are replaced by recorders, so what each rank would restore is visible."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from trainer.seed import gather_rng_states, restore_rank_rng_states


class FakeCuda:
    """Stands in for torch.cuda's generator functions on a machine with `devices` GPUs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, devices: int = 2, current: int = 0) -> None:
        self.restored: list[torch.Tensor] = []
        self.state = torch.arange(16, dtype=torch.uint8)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: devices > 0)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.state.clone())
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": self.restored.append(state))


def two_ranks(own: torch.Tensor) -> torch.Tensor:
    """An all_gather of two ranks whose GPU generators differ (rank 1's bytes are rank 0's plus
    one); their CPU, Python and NumPy states are alike, so either row restores validly."""
    return torch.stack([own, own + 1 if own.numel() == 16 else own])


def test_each_rank_gets_its_own_gpu_generator_back(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(monkeypatch)
    states = gather_rng_states(two_ranks, device_type="cuda")
    assert states["cuda_device"].shape == (2, 16)  # type: ignore[union-attr]
    restore_rank_rng_states(states, rank=1, device_type="cuda")
    (restored,) = cuda.restored
    assert restored.dtype == torch.uint8 and restored.device.type == "cpu"
    assert torch.equal(restored, cuda.state + 1)  # rank 1's row, not rank 0's


def test_cpu_state_and_python_numpy_streams_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    states = gather_rng_states(lambda own: own.unsqueeze(0))
    expected = (torch.rand(2), random.random(), np.random.rand())
    torch.manual_seed(4), random.seed(4), np.random.seed(4)
    restore_rank_rng_states(states, rank=0)
    assert torch.equal(torch.rand(2), expected[0]) and random.random() == expected[1]
    assert np.random.rand() == expected[2]


def test_a_cpu_run_leaves_a_gpu_checkpoints_generator_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(monkeypatch)
    states = gather_rng_states(two_ranks, device_type="cuda")
    restore_rank_rng_states(states, rank=0, device_type="cpu")
    assert cuda.restored == []  # resuming on the CPU must not create a CUDA context


@pytest.mark.parametrize(("current", "restored_index"), [(1, 1), (3, None)])
def test_older_checkpoints_list_restores_the_current_device_if_it_exists(
        monkeypatch: pytest.MonkeyPatch, current: int, restored_index: int | None) -> None:
    """Before per-rank GPU states, a checkpoint held rank 0's list of every device's state."""
    cuda = FakeCuda(monkeypatch, devices=4, current=current)
    states = gather_rng_states(two_ranks)
    legacy = [torch.full((16,), index, dtype=torch.uint8) for index in range(2)]
    restore_rank_rng_states({**states, "cuda": legacy}, rank=1, device_type="cuda")
    if restored_index is None:
        assert cuda.restored == []  # written on a machine with fewer GPUs: nothing to take
    else:
        (restored,) = cuda.restored
        assert torch.equal(restored, legacy[restored_index])
