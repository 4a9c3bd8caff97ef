"""Hyperparameters stored in checkpoints must be plain Python, whatever the user passed."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from trainer.hparams import plain_hparams


def test_omegaconf_values_become_plain_resolved_containers() -> None:
    cfg = OmegaConf.create({"width": 8, "model": {"hidden": "${width}", "layers": [1, 2]}})
    params = plain_hparams({"model": cfg.model, "lr": 0.1})
    assert params == {"model": {"hidden": 8, "layers": [1, 2]}, "lr": 0.1}
    assert type(params["model"]) is dict and type(params["model"]["layers"]) is list


def test_other_objects_are_stored_as_their_repr(tmp_path: Path) -> None:
    params = plain_hparams({"ns": argparse.Namespace(a=1), "t": torch.tensor([1.0, 2.0]), "none": None})
    assert params == {"ns": "Namespace(a=1)", "t": repr(torch.tensor([1.0, 2.0])), "none": None}
    torch.save(params, tmp_path / "hparams.pt")
    assert torch.load(tmp_path / "hparams.pt", weights_only=True) == params
