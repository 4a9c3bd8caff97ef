"""Run under torchrun: rank 1 receives SIGTERM at step 5 of the first attempt; with --max-restarts the
agent restarts the group, which resumes from the preemption checkpoint by itself.

    torchrun --max-restarts 1 ... -m tests.helpers.torchrun_preempt_resume ROOT OUT [NOTICE_STEP]

NOTICE_STEP -1: no notice (the uninterrupted run to compare with).
"""

from __future__ import annotations

import sys

import torch

from tests.helpers.models import RegressionData
from tests.helpers.preemption import NoticeAtStep
from trainer import Trainer, seed_everything


def main(root: str, out: str, notice_step: int = 5) -> None:
    seed_everything(11)
    model = NoticeAtStep(step=notice_step, to="rank1")
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=root)
    trainer.fit(model, datamodule=RegressionData(batch_size=8, shuffle=True))
    if trainer.is_global_zero:
        torch.save({"state_dict": model.state_dict(), "global_step": trainer.global_step}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 5)
