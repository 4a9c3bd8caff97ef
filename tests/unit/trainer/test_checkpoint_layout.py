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
from lightning.pytorch.demos.boring_classes import BoringModel, ManualOptimBoringModel  # noqa: E402

from trainer import Trainer  # noqa: E402

class _Saver(pl.Callback):
    """Checkpoints where a loop is between two of its counters: batch end (stepping or only
    accumulating), epoch end, validation end, fit end."""

    def __init__(self, dirpath: Path) -> None:
        self.dirpath = dirpath

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        trainer.save_checkpoint(self.dirpath / f"batch_end_e{trainer.current_epoch}_b{batch_idx}.ckpt")

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


class _StepScheduler(_CountingModel):
    """A scheduler stepped every other optimizer step (Lightning counts its steps)."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 2}}


class _Plateau(_CountingModel):
    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        output = super().validation_step(batch, batch_idx)
        self.log("val_loss", output["x"])
        return output

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}


def _fit(trainer_class: type, dirpath: Path, ckpt_path: str | None = None, model_class: type = _CountingModel,
         after: tuple[str, ...] = (), **kwargs: Any) -> tuple[Any, Any]:
    """Fit with checkpoints at every save point; then run the `after` stages, a checkpoint after each."""
    pl.seed_everything(7)
    model = model_class()
    every_step = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=-1)
    arguments = {"max_epochs": 2, "limit_train_batches": 3, "limit_val_batches": 2, **kwargs}
    trainer = trainer_class(default_root_dir=dirpath, callbacks=[every_step, _Saver(dirpath)], logger=False,
                            enable_progress_bar=False, enable_model_summary=False, **arguments)
    trainer.fit(model, ckpt_path=ckpt_path)
    for number, stage in enumerate(after):
        getattr(trainer, stage)(model)
        trainer.save_checkpoint(dirpath / f"after_{number}_{stage}.ckpt")
    return trainer, model


def _loops(dirpath: Path) -> dict[str, dict[str, Any]]:
    """Each checkpoint's `loops`, without our own exact-resume section."""
    found = {}
    for path in sorted(glob.glob(str(dirpath / "*.ckpt"))):
        loops = torch.load(path, weights_only=True)["loops"]
        loops.pop("ddp_trainer", None)
        found[os.path.basename(path)] = loops
    return found


_RUNS = {
    "plain": {},
    "accumulation": {"accumulate_grad_batches": 2, "limit_train_batches": 5},
    "mid-epoch-validation": {"val_check_interval": 2, "limit_train_batches": 4},
    "step-scheduler": {"model_class": _StepScheduler},
    "plateau-scheduler": {"model_class": _Plateau, "max_epochs": 3},
    "manual-optimization": {"model_class": ManualOptimBoringModel},
    "evaluation-stages": {"after": ("validate", "test", "validate", "predict")},
}


@pytest.mark.parametrize("kwargs", list(_RUNS.values()), ids=list(_RUNS))
def test_checkpoint_loops_equal_lightnings(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    """Every key of Lightning's `checkpoint["loops"]` (the fit loop's progress, its schedulers'
    and both optimization loops' counters, the validation inside fit, the validate/test/predict
    loops), with Lightning's values, at every point a checkpoint is written."""
    _fit(pl.Trainer, tmp_path / "lightning", **kwargs)
    _fit(Trainer, tmp_path / "ours", **kwargs)
    theirs, ours = _loops(tmp_path / "lightning"), _loops(tmp_path / "ours")
    assert len(theirs) >= 9 and sorted(ours) == sorted(theirs)
    for name, loops in theirs.items():
        assert ours[name] == loops, name


@pytest.mark.parametrize("written_by", ["ours", "lightning"])
def test_resumed_loops_equal_lightnings_after_a_skipped_validation(tmp_path: Path, written_by: str) -> None:
    """Resumed from a checkpoint written in on_train_batch_end before that batch's validation, both
    Trainers go on at the next batch; Lightning counts the skipped validation's batches as run."""
    classes = {"ours": Trainer, "lightning": pl.Trainer}
    kwargs = {"val_check_interval": 2, "limit_train_batches": 4, "max_epochs": 3}
    _fit(classes[written_by], tmp_path / "written", **kwargs)
    checkpoint = str(tmp_path / "written" / "batch_end_e1_b1.ckpt")
    _fit(pl.Trainer, tmp_path / "lightning", ckpt_path=checkpoint, **kwargs)
    _fit(Trainer, tmp_path / "ours", ckpt_path=checkpoint, **kwargs)
    theirs, ours = _loops(tmp_path / "lightning"), _loops(tmp_path / "ours")
    assert len(theirs) >= 9 and sorted(ours) == sorted(theirs)
    for name, loops in theirs.items():
        assert ours[name] == loops, name


def test_our_exact_resume_state_sits_beside_lightnings_loops(tmp_path: Path) -> None:
    _fit(pl.Trainer, tmp_path / "lightning")
    _fit(Trainer, tmp_path / "ours")
    ours = torch.load(tmp_path / "ours" / "epoch=0-step=2.ckpt", weights_only=True)
    theirs = torch.load(tmp_path / "lightning" / "epoch=0-step=2.ckpt", weights_only=True)
    assert set(ours) == set(theirs)  # Lightning's top-level keys, nothing more
    assert {"rng_states", "metrics", "batch_in_epoch"} <= set(ours["loops"]["ddp_trainer"])
    assert set(ours["loops"]) == set(theirs["loops"]) | {"ddp_trainer"}
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


def test_checkpoints_written_before_these_counters_still_resume(tmp_path: Path) -> None:
    """A checkpoint of ours from before the scheduler, validation and evaluation-loop counters
    (only the fit loop's progress, our section without the new fields) resumes as before."""
    _fit(Trainer, tmp_path / "written", max_epochs=3)
    for name in ("batch_end_e1_b1.ckpt", "epoch0_end.ckpt"):
        checkpoint = torch.load(tmp_path / "written" / name, weights_only=True)
        old_keys = ("state_dict", "epoch_progress", "epoch_loop.state_dict", "epoch_loop.batch_progress",
                    "epoch_loop.automatic_optimization.optim_progress")
        checkpoint["loops"] = {
            "fit_loop": {key: checkpoint["loops"]["fit_loop"][key] for key in old_keys},
            "ddp_trainer": {key: value for key, value in checkpoint["loops"]["ddp_trainer"].items()
                            if key not in ("scheduler_steps", "scheduler_steps_in_epoch", "fit_validation",
                                           "in_batch_end")}}
        torch.save(checkpoint, tmp_path / f"old_{name}")
        _, from_new = _fit(Trainer, tmp_path / f"new_{name}", ckpt_path=str(tmp_path / "written" / name), max_epochs=3)
        trainer, from_old = _fit(Trainer, tmp_path / f"old_{name}_run", ckpt_path=str(tmp_path / f"old_{name}"),
                                 max_epochs=3)
        assert from_old.batches_seen == from_new.batches_seen and trainer.global_step == 9
