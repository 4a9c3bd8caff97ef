"""Run under torchrun (2 ranks, gloo): `pytorch_lightning.Trainer` with our plug-in at zero_stage 0, 1 and 2.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/helpers/lightning_zero.py OUT_DIR

The fits (AdamW with two param groups, norm clipping, a step scheduler) run in the same processes; each
writes a checkpoint. Rank 0 writes `OUT_DIR/zero.pt`: each run's weights, each checkpoint's optimizer
states, and rank 0's optimizer state size in each run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.lightning import LightningDDPStrategy


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second, self.head = nn.Linear(7, 13), nn.Linear(13, 11), nn.Linear(11, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self.head(torch.tanh(self.second(torch.tanh(self.first(x)))))
        return nn.functional.mse_loss(out, y)

    def configure_optimizers(self) -> Any:
        decay = [p for name, p in self.named_parameters() if name.endswith("weight")]
        rest = [p for name, p in self.named_parameters() if not name.endswith("weight")]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "lr": 0.005}],
                                      lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(96, 7, generator=generator)
    return DataLoader(TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True))), batch_size=8)


def fit(zero_stage: int, out: Path) -> dict[str, Any]:
    model = Net()
    strategy = LightningDDPStrategy(bucket_cap_mb=0.0005, first_bucket_cap_mb=0.0002, zero_stage=zero_stage)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=2, gradient_clip_val=0.05,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=out)
    trainer.fit(model, data())
    path = out / f"zero{zero_stage}.ckpt"
    trainer.save_checkpoint(path)  # every rank: the consolidation is a collective
    state = trainer.optimizers[0].state
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()},
            "optimizer_states": torch.load(path, weights_only=True)["optimizer_states"],
            "state_elements": sum(v.numel() for s in state.values() for v in s.values()
                                  if isinstance(v, torch.Tensor) and v.dim() > 0)}


def main(out: Path) -> None:
    results = {f"zero{stage}": fit(stage, out) for stage in (0, 1, 2)}
    if torch.distributed.get_rank() == 0:
        torch.save(results, out / "zero.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
