"""Run under torchrun: fit with periodic checkpoints; rank 1 may die once at a given step.

    torchrun --max-restarts 1 ... -m tests.helpers.torchrun_crash_resume CRASH_STEP CKPT_DIR OUT
"""

from __future__ import annotations

import sys

import torch

from tests.helpers.models import CrashOnceRegressor, RegressionData
from trainer import Trainer, seed_everything
from trainer.callbacks import ModelCheckpoint


def main(crash_step: int, checkpoint_dir: str, out: str) -> None:
    seed_everything(5)
    model = CrashOnceRegressor(crash_step=crash_step, optimizer="adam")
    checkpoint = ModelCheckpoint(dirpath=checkpoint_dir, every_n_train_steps=2, save_last=True)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[checkpoint])
    trainer.fit(model, datamodule=RegressionData(batch_size=8, shuffle=True))
    if trainer.is_global_zero:
        torch.save({"state_dict": model.state_dict(), "global_step": trainer.global_step}, out)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
