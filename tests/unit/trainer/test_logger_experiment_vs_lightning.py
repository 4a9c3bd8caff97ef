"""Loggers' experiments exist before the setup hooks, as under Lightning's Trainer: a callback's `setup`
finds the run directory made and the writer created, with Lightning's loggers and with ours."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos.boring_classes import BoringModel  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.loggers import CSVLogger, TensorBoardLogger  # noqa: E402


class SeenAtSetup(pl.Callback):
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        logger = trainer.logger
        self.seen = (os.path.isdir(logger.log_dir), getattr(logger, "_experiment", None) is not None)


def _seen(trainer_class: type, logger: Any, root: Path) -> tuple[bool, bool]:
    callback = SeenAtSetup()
    trainer_class(default_root_dir=root, logger=logger, max_steps=1, limit_val_batches=0, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=False, callbacks=[callback]).fit(BoringModel())
    return callback.seen


@pytest.mark.parametrize("kind", ["TensorBoardLogger", "CSVLogger"])
def test_lightnings_loggers_have_their_experiment_at_setup_under_both_trainers(tmp_path: Path, kind: str) -> None:
    logger_class = getattr(pl.loggers, kind)
    lightning = _seen(pl.Trainer, logger_class(save_dir=tmp_path / "pl"), tmp_path / "pl")
    assert lightning == (True, True)
    assert _seen(Trainer, logger_class(save_dir=tmp_path / "ours"), tmp_path / "ours") == lightning


@pytest.mark.parametrize("logger_class", [TensorBoardLogger, CSVLogger])
def test_our_loggers_have_their_experiment_at_setup(tmp_path: Path, logger_class: type) -> None:
    logger = logger_class(save_dir=tmp_path)
    assert _seen(Trainer, logger, tmp_path)[0]
    if logger_class is CSVLogger:
        assert logger.experiment is logger and logger.experiment.metrics_file_path.endswith("metrics.csv")
