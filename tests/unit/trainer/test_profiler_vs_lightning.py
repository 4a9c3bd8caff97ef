"""`Trainer(profiler=...)` and `trainer.profiler`, against Lightning's Trainer: the same actions timed the
same number of times (hooks, strategy steps, training batches and epochs, checkpoint saves, the user's
own blocks), with Lightning's SimpleProfiler handed to either Trainer, and our "simple" report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos.boring_classes import BoringModel  # noqa: E402
from pytorch_lightning.profilers import SimpleProfiler as LightningSimpleProfiler  # noqa: E402

from trainer import Trainer  # noqa: E402

STEPS, EPOCHS = 3, 2


class Profiled(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        with self.trainer.profiler.profile("user_block"):  # works with no profiler too (a pass-through)
            return super().training_step(batch, batch_idx)


def _fit(trainer_class: type, root: Path, profiler: Any) -> Any:
    trainer = trainer_class(default_root_dir=root, max_epochs=EPOCHS, limit_train_batches=STEPS, limit_val_batches=2,
                            num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, profiler=profiler)
    trainer.fit(Profiled())
    return trainer


SHARED = ["run_training_epoch", "run_training_batch", "user_block", "save_checkpoint",
          "[Strategy]SingleDeviceStrategy.training_step", "[Strategy]SingleDeviceStrategy.backward",
          "[Strategy]SingleDeviceStrategy.validation_step", "[LightningModule]Profiled.configure_optimizers",
          "[LightningModule]Profiled.on_train_epoch_end", "[LightningModule]Profiled.optimizer_zero_grad",
          "[LightningModule]Profiled.on_validation_epoch_end"]


def test_a_lightning_profiler_times_the_same_actions_under_both_trainers(tmp_path: Path) -> None:
    counts = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        profiler = LightningSimpleProfiler()
        _fit(trainer_class, tmp_path / name, profiler)
        counts[name] = {action: len(profiler.recorded_durations.get(action, [])) for action in SHARED}
    assert counts["ours"] == counts["lightning"]
    assert counts["ours"]["run_training_batch"] == STEPS * EPOCHS and counts["ours"]["user_block"] == STEPS * EPOCHS


def test_simple_prints_a_report_per_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trainer = _fit(Trainer, tmp_path, "simple")
    report = capsys.readouterr().out
    assert "Profiler report: fit" in report
    rows = {line.split("|")[0].strip(): line.split("|") for line in report.splitlines() if "|" in line}
    assert int(rows["run_training_batch"][2]) == STEPS * EPOCHS
    assert int(rows["train_dataloader_next"][2]) >= STEPS * EPOCHS
    trainer.validate(Profiled(), verbose=False)
    assert "Profiler report: validate" in capsys.readouterr().out


def test_simple_with_a_filename_writes_the_report_there(tmp_path: Path) -> None:
    from trainer.profiler import SimpleProfiler

    _fit(Trainer, tmp_path, SimpleProfiler(dirpath=tmp_path / "prof", filename="perf"))
    assert "run_training_batch" in (tmp_path / "prof" / "fit-perf.txt").read_text()


def test_no_profiler_costs_nothing_and_unknown_ones_are_refused(tmp_path: Path) -> None:
    trainer = _fit(Trainer, tmp_path, None)
    assert trainer.profiler.summary() == ""
    with pytest.raises(ValueError, match="profiler='advanced' is not available"):
        Trainer(profiler="advanced")
    with pytest.raises(TypeError, match="needs profile\\(action_name\\) and describe\\(\\)"):
        Trainer(profiler=torch.nn.Linear(1, 1))
