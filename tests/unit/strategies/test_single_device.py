"""SingleDeviceStrategy: one process, one device, identity collectives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import SingleDeviceStrategy


def _configured() -> SingleDeviceStrategy:
    strategy = SingleDeviceStrategy()
    strategy.configure(accelerator="cpu", devices=1, num_nodes=1)
    return strategy


@pytest.mark.parametrize(("devices", "num_nodes"), [(2, 1), (1, 2)])
def test_more_than_one_device_is_refused(devices: int, num_nodes: int) -> None:
    with pytest.raises(ValueError, match=f"devices={devices} and num_nodes={num_nodes}.*strategy='ddp'"):
        SingleDeviceStrategy().configure(accelerator="cpu", devices=devices, num_nodes=num_nodes)


def test_launch_runs_in_this_process_after_setup() -> None:
    strategy = _configured()
    assert strategy.launch(lambda x, y=0: x + y, 2, y=3) == 5  # in place: even a lambda is fine


def test_ranks_device_and_summary() -> None:
    strategy = _configured()
    strategy.setup_environment()
    assert (strategy.global_rank, strategy.local_rank, strategy.world_size, strategy.is_global_zero) == (0, 0, 1, True)
    assert strategy.root_device == torch.device("cpu")
    assert strategy.summary() == {"strategy": "SingleDeviceStrategy", "world_size": 1, "device": "cpu"}


def test_auto_accelerator_is_resolved_at_setup() -> None:
    strategy = SingleDeviceStrategy()  # never configured: setup_environment resolves "auto"
    strategy.setup_environment()
    assert strategy.accelerator in ("cpu", "cuda")


def test_module_loader_gradients_and_collectives_pass_through() -> None:
    strategy = _configured()
    module = strategy.setup_module(nn.Linear(2, 1))
    loader = DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)
    assert strategy.process_dataloader(loader) is loader
    with strategy.no_sync():
        strategy.backward(module(torch.ones(1, 2)).sum())
    assert module.weight.grad is not None
    value = torch.tensor([1.0, 2.0])
    assert torch.equal(strategy.reduce(value, reduce_op="sum"), value)
    assert strategy.all_gather(value).shape == (2,)  # as Lightning's single-device strategy: no rank dimension
    assert strategy.all_gather_ranks(value).shape == (1, 2)
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    strategy.barrier()


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    strategy = _configured()
    strategy.save_checkpoint({"w": torch.ones(2)}, tmp_path / "a.ckpt")
    assert torch.equal(strategy.load_checkpoint(tmp_path / "a.ckpt")["w"], torch.ones(2))
    strategy.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()
