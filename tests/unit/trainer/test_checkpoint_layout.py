"""The checkpoint's `loops` entry against Lightning's own, and resuming across the two Trainers.

Lightning's Trainer is the oracle: the same run under both writes checkpoints at the same points
(every step, at epoch end, after validation, after the fit), and their loop counters must be
equal; each Trainer resumes from a checkpoint the other wrote at the same place.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402

from trainer import Trainer  # noqa: E402

_COUNTERS = ("epoch_progress", "epoch_loop.batch_progress", "epoch_loop.state_dict")


class _Saver(pl.Callback):
    """Checkpoints where a loop is between two of its counters: epoch end, validation end, fit end."""

    def __init__(self, dirpath: Path) -> None:
        self.dirpath = dirpath

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        trainer.save_checkpoint(self.dirpath / f"epoch{trainer.current_epoch}_end.ckpt")

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if not trainer.sanity_checking:
            trainer.save_checkpoint(self.dirpath / f"validated_at_step{trainer.global_step}.ckpt")

    def on_train_end(self, trainer: Any, module: Any) -> None:
        trainer.save_checkpoint(self.dirpath / "train_end.ckpt")


class _CountingModel(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.batches_seen: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.batches_seen.append(batch_idx)
        return super().training_step(batch, batch_idx)


def _fit(trainer_class: type, dirpath: Path, ckpt_path: str | None = None, **kwargs: Any) -> tuple[Any, Any]:
    pl.seed_everything(7)
    model = _CountingModel()
    every_step = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=-1)
    trainer = trainer_class(default_root_dir=dirpath, max_epochs=2, limit_train_batches=3, limit_val_batches=2,
                            callbacks=[every_step, _Saver(dirpath)], logger=False, enable_progress_bar=False,
                            enable_model_summary=False, **kwargs)
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model


def _loop_counters(dirpath: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(glob.glob(str(dirpath / "*.ckpt"))):
        fit_loop = torch.load(path, weights_only=True)["loops"]["fit_loop"]
        steps = fit_loop.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {})
        found[os.path.basename(path)] = {key: fit_loop.get(key) for key in _COUNTERS} | {"steps": steps.get("step")}
    return found


@pytest.mark.parametrize("kwargs", [{}, {"accumulate_grad_batches": 2}, {"val_check_interval": 2}],
                         ids=["plain", "accumulation", "mid-epoch-validation"])
def test_loop_counters_equal_lightnings(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    _fit(pl.Trainer, tmp_path / "lightning", **kwargs)
    _fit(Trainer, tmp_path / "ours", **kwargs)
    theirs, ours = _loop_counters(tmp_path / "lightning"), _loop_counters(tmp_path / "ours")
    assert len(theirs) >= 9 and sorted(ours) == sorted(theirs)
    for name, counters in theirs.items():
        assert ours[name] == counters, name


def test_our_exact_resume_state_sits_beside_lightnings_loops(tmp_path: Path) -> None:
    _fit(pl.Trainer, tmp_path / "lightning")
    _fit(Trainer, tmp_path / "ours")
    ours = torch.load(tmp_path / "ours" / "epoch=0-step=2.ckpt", weights_only=True)
    theirs = torch.load(tmp_path / "lightning" / "epoch=0-step=2.ckpt", weights_only=True)
    assert set(ours) == set(theirs)  # Lightning's top-level keys, nothing more
    assert {"rng_states", "metrics", "batch_in_epoch"} <= set(ours["loops"]["ddp_trainer"])
    assert set(ours["loops"]) == {"fit_loop", "ddp_trainer"}
    rng = ours["loops"]["ddp_trainer"]["rng_states"]["torch"]
    assert rng.dtype == torch.float64 and torch.equal(rng, rng.round())  # exact integers, comparable numerically


@pytest.mark.parametrize("written_by, resumed_by", [("ours", "lightning"), ("lightning", "ours")])
@pytest.mark.parametrize("checkpoint", ["epoch=0-step=2.ckpt", "epoch0_end.ckpt", "validated_at_step3.ckpt"])
def test_each_trainer_resumes_from_the_others_checkpoint(tmp_path: Path, written_by: str, resumed_by: str,
                                                         checkpoint: str) -> None:
    classes = {"ours": Trainer, "lightning": pl.Trainer}
    _fit(classes[written_by], tmp_path / "written")
    _fit(classes[resumed_by], tmp_path / "own")  # the resuming Trainer's own checkpoint at the same place
    _, from_own = _fit(classes[resumed_by], tmp_path / "own_resume", ckpt_path=str(tmp_path / "own" / checkpoint))
    resumed_trainer, from_other = _fit(classes[resumed_by], tmp_path / "resume",
                                       ckpt_path=str(tmp_path / "written" / checkpoint))
    assert from_other.batches_seen == from_own.batches_seen
    assert resumed_trainer.global_step == 6 and resumed_trainer.current_epoch == 2
