"""A 2-process fit saving in the background whose rank 0 is SIGKILLed in the middle of a checkpoint write
(tests/distributed/test_async_checkpoint_kill.py runs it in a subprocess): `python -m
tests.helpers.async_kill_job DIR SAVE_INDEX AFTER_BYTES`. Also the fit the test resumes and compares."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from strategies import DDPStrategy
from tests.helpers.checkpoint_writers import KilledMidWrite
from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer, seed_everything
from trainer.callbacks import ModelCheckpoint

MAX_STEPS = 16


def fit(directory: Path, checkpoint_io: Any, ckpt_path: str | None = None) -> TinyRegressor:
    """Saves every 2 steps in the background, keeping one top-k file and `last.ckpt`."""
    seed_everything(0)
    model = TinyRegressor(optimizer="adam")
    checkpoints = ModelCheckpoint(dirpath=directory, every_n_train_steps=2, save_top_k=1, save_last=True,
                                  filename="{step}")
    trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(async_checkpoint=True,
                                                                         checkpoint_io=checkpoint_io),
                      max_steps=MAX_STEPS, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=directory, callbacks=[checkpoints])
    trainer.fit(model, datamodule=RegressionData(batch_size=4, shuffle=True), ckpt_path=ckpt_path)
    return model


if __name__ == "__main__":
    directory, save_index, after_bytes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    # The kill comes from the writer thread while the training thread runs on.
    fit(directory, KilledMidWrite(save_index, after_bytes))
    torch.save({"survived": True}, directory / "not_killed.pt")
