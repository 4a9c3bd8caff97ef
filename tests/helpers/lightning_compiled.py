"""A torch.compile'd module in pytorch_lightning.Trainer at 2 ranks (Lightning's subprocess
launcher re-runs this file for rank 1), with Lightning's own "ddp" or our LightningDDPStrategy.
Rank 0 writes the trained weights to OUT/weights.pt.

    python tests/helpers/lightning_compiled.py {ddp|ours} OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies.lightning import LightningDDPStrategy
from tests.helpers.compile_backends import MlpSteps, recording_aot_eager


class Mlp(MlpSteps, pl.LightningModule):
    pass


def main(mode: str, out: str) -> None:
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 32, generator=generator), torch.randn(64, 1, generator=generator))
    # Buckets of ~16 KiB, so the compiled graph splits into pieces under our strategy.
    strategy = LightningDDPStrategy(bucket_cap_mb=0.016, first_bucket_cap_mb=0.004) if mode == "ours" else "ddp"
    model = Mlp()
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=out)
    # Under both strategies Lightning injects the same (seeded, shuffling) DistributedSampler.
    trainer.fit(torch.compile(model, backend=recording_aot_eager), DataLoader(data, batch_size=8))
    if trainer.is_global_zero:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, Path(out, "weights.pt"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
