"""Hyperparameters stored in checkpoints: Hydra configs as plain Python, other objects as Lightning stores them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from trainer import Trainer
import pytest

from trainer.hparams import checkpoint_hparams


def test_omegaconf_values_become_plain_resolved_containers() -> None:
    cfg = OmegaConf.create({"width": 8, "model": {"hidden": "${width}", "layers": [1, 2]}})
    params = checkpoint_hparams({"model": cfg.model, "lr": 0.1})
    assert params == {"model": {"hidden": 8, "layers": [1, 2]}, "lr": 0.1}
    assert type(params["model"]) is dict and type(params["model"]["layers"]) is list


def test_other_objects_are_stored_as_themselves_and_unpicklable_ones_as_their_repr() -> None:
    namespace, tensor = argparse.Namespace(a=1), torch.tensor([1.0, 2.0])
    params = checkpoint_hparams({"ns": namespace, "t": tensor, "none": None, "betas": (0.9, 0.99)})
    assert params["ns"] is namespace and params["t"] is tensor and params["none"] is None
    assert params["betas"] == (0.9, 0.99) and type(params["betas"]) is tuple
    with pytest.warns(UserWarning, match="'act' \\(function\\) cannot be pickled.*act=\\.\\.\\."):
        kept = checkpoint_hparams({"act": lambda x: x})
    assert kept["act"].startswith("<function")


def _fit_and_load(trainer_class: type, model_class: type, data_class: type, hparams: object,
                  root: Path) -> tuple[Any, Any, dict[str, Any]]:
    """Fit one epoch, then rebuild the module and the datamodule from the checkpoint with their own
    class's `load_from_checkpoint`."""
    trainer = trainer_class(default_root_dir=root, max_epochs=1, limit_train_batches=2, limit_val_batches=1,
                            logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                            devices=1)
    trainer.fit(model_class(hparams), datamodule=data_class(hparams))
    path = str(next((root / "checkpoints").glob("*.ckpt")))
    raw = torch.load(path, weights_only=True)
    data = data_class.load_from_checkpoint(path) if hasattr(data_class, "load_from_checkpoint") else None
    return model_class.load_from_checkpoint(path), data, raw


def test_hparams_given_as_one_object_round_trip_as_under_lightning(tmp_path: Path) -> None:
    """Oracle: a Lightning module and datamodule that each take their hyperparameters as one object
    (a dict, a Namespace), trained by Lightning's Trainer and by ours, write the same hyperparameter
    keys and load back through Lightning's loader the same way."""
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringDataModule, BoringModel

    from trainer import Trainer

    class Model(BoringModel):
        def __init__(self, hparams: object) -> None:
            super().__init__()
            self.save_hyperparameters(hparams)

    class Data(BoringDataModule):
        def __init__(self, hparams: object) -> None:
            super().__init__()
            self.save_hyperparameters(hparams)

    for index, hparams in enumerate([{"test_arg": 14}, argparse.Namespace(test_arg=14)]):
        runs = {name: _fit_and_load(trainer_class, Model, Data, hparams, tmp_path / f"{name}{index}")
                for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer))}
        keys = ("hyper_parameters", "hparams_name", "datamodule_hyper_parameters", "datamodule_hparams_name")
        assert {k: runs["ours"][2].get(k) for k in keys} == {k: runs["lightning"][2].get(k) for k in keys}
        for name, (model, data, _) in runs.items():
            assert model.hparams.test_arg == data.hparams.test_arg == 14, name


def test_our_module_passes_one_object_back_to_its_init(tmp_path: Path) -> None:
    """Our LightningModule's `save_hyperparameters(hparams)` + `load_from_checkpoint`, as Lightning's."""
    from tests.helpers.models import RegressionData, TinyRegressor

    class Model(TinyRegressor):
        def __init__(self, hparams: Any) -> None:
            super().__init__(**hparams)
            self._hparams.clear()
            self.save_hyperparameters(hparams)

    hparams = {"features": 4, "lr": 0.01, "optimizer": "sgd"}
    model, _, raw = _fit_and_load(Trainer, Model, lambda hparams: RegressionData(), hparams, tmp_path)
    assert raw["hparams_name"] == "hparams" and raw["hyper_parameters"] == hparams
    assert model.hparams.lr == 0.01
