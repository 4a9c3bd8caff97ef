"""Run under torchrun (2 ranks): `pytorch_lightning.Trainer` with our `LightningDDPStrategy`, three fits
in the same processes: uninterrupted; rank 1 gets SIGTERM at step STEP (default 5); resumed with ckpt_path="hpc".

    python -m torch.distributed.run --standalone --nproc-per-node=2 -m tests.helpers.lightning_preemption OUT_DIR [STEP]

Global rank 0 writes OUT_DIR/result.pt: both final state dicts, the steps, what the preempted fit raised.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.lightning import LightningDDPStrategy

DROPOUT = float(os.environ.get("TEST_DROPOUT", "0.0"))  # Lightning's checkpoints hold no RNG state: 0 keeps resumes exact


class Regressor(pl.LightningModule):
    def __init__(self, notice_step: int = -1) -> None:
        super().__init__()
        self.notice_step = notice_step
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(DROPOUT), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.notice_step and self.global_rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)


def fit(root: Path, notice_step: int = -1, ckpt_path: str | None = None) -> tuple[pl.Trainer, Regressor]:
    pl.seed_everything(11)
    model = Regressor(notice_step)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=LightningDDPStrategy(), max_epochs=3, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=root)
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model


def main(out: Path, notice_step: int) -> None:
    plain_trainer, plain = fit(out / "plain")
    raised, code = "", None
    try:
        fit(out / "preempted", notice_step=notice_step)
    except SystemExit as error:
        raised, code = type(error).__name__, error.code
    checkpoint = torch.load(out / "preempted" / "hpc_ckpt_1.ckpt", weights_only=False)
    resumed_trainer, resumed = fit(out / "preempted", ckpt_path="hpc")
    if resumed_trainer.is_global_zero:
        torch.save({"plain": plain.state_dict(), "resumed": resumed.state_dict(), "raised": raised, "code": code,
                    "checkpoint_step": checkpoint["global_step"], "plain_step": plain_trainer.global_step,
                    "resumed_step": resumed_trainer.global_step}, out / "result.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5)
