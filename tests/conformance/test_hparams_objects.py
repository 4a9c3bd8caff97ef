"""A module whose hyperparameters hold objects, as the Lightning + Hydra template's does
(`MNISTLitModule(net=SimpleDenseNet(...), optimizer=functools.partial(...))` + `save_hyperparameters()`).

Lightning pickles those objects into the checkpoint: loading it refuses by default (torch's
weights_only) and rebuilds the module with `weights_only=False`. A checkpoint our Trainer writes of the
same run must behave the same under Lightning's loader and ours, on 1 and 2 processes."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.checkpoint_io import UntrustedCheckpointError
from trainer import LightningModule as OurModule
from trainer import Trainer


def _template_like(base: type) -> type:
    class NetModule(base):  # type: ignore[misc, valid-type]
        def __init__(self, net: nn.Module, optimizer: Any) -> None:
            super().__init__()
            self.save_hyperparameters(logger=False)
            self.net = net

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return self.hparams.optimizer(params=self.parameters())

        def train_dataloader(self) -> DataLoader:
            x = torch.randn(16, 3, generator=torch.Generator().manual_seed(0))
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    return NetModule


LightningNet, OurNet = _template_like(pl.LightningModule), _template_like(OurModule)
# Bound at module level so the classes pickle by reference (as a project's own modules do).
LightningNet.__qualname__ = LightningNet.__name__ = "LightningNet"
OurNet.__qualname__ = OurNet.__name__ = "OurNet"


def _train(trainer_class: type, module_class: type, root: Path, devices: int) -> tuple[str, dict[str, Any]]:
    torch.manual_seed(0)
    module = module_class(net=nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)),
                          optimizer=functools.partial(torch.optim.SGD, lr=0.05))
    trainer = trainer_class(default_root_dir=str(root), max_epochs=1, accelerator="cpu", devices=devices,
                            logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module)
    path = str(next(root.rglob("*.ckpt")))
    return path, {k: v.detach().clone() for k, v in module.state_dict().items()}


def _rebuilt_as_trained(module_class: type, path: str, trained: dict[str, Any]) -> None:
    rebuilt = module_class.load_from_checkpoint(path, weights_only=False)
    assert isinstance(rebuilt.hparams.net, nn.Sequential)
    assert isinstance(rebuilt.hparams.optimizer, functools.partial)
    for key, value in rebuilt.state_dict().items():
        assert torch.equal(value, trained[key]), key


@pytest.mark.timeout(180)
@pytest.mark.conformance
def test_objects_in_hparams_rebuild_with_the_opt_in_as_under_lightning(tmp_path: Path) -> None:
    import pickle

    runs = {"lightning": _train(pl.Trainer, LightningNet, tmp_path / "lightning", 1),
            "ours": _train(Trainer, LightningNet, tmp_path / "ours", 1),
            "ours_2": _train(Trainer, LightningNet, tmp_path / "ours_2", 2)}
    for name, (path, trained) in runs.items():
        with pytest.raises(pickle.UnpicklingError):  # Lightning's loader, torch's default
            LightningNet.load_from_checkpoint(path)
        _rebuilt_as_trained(LightningNet, path, trained)
    # Our own LightningModule class: the same file, the same opt-in, and a refusal that names it.
    path, trained = _train(Trainer, OurNet, tmp_path / "our_class", 1)
    with pytest.raises(UntrustedCheckpointError, match="weights_only=False"):
        OurNet.load_from_checkpoint(path)
    _rebuilt_as_trained(OurNet, path, trained)
