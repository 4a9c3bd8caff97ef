"""`python -m benchmarks.contenders.new_trainer_fits {ours|ours_reuse|pl_notebook} K OUT_JSON`: a notebook's
habit in a plain script, "new Trainer, fit one epoch", K times in one process (`ours_reuse`: one Trainer
fits K fresh models). `strategy="ddp_notebook"`, 2 CPU ranks, logger, checkpointing, bar and summary off.
Rank 0 (the calling process under both Trainers' ddp_notebook) writes the seconds of each fit."""

from __future__ import annotations

import importlib
import json
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _module_class(base: type) -> type:
    class Classifier(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            self.log("loss", loss, prog_bar=False)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Classifier


def main(kind: str, fits: int, out: str) -> None:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 32, generator=generator), torch.randint(0, 4, (256,), generator=generator))
    loader = DataLoader(data, batch_size=16)
    options = dict(accelerator="cpu", devices=2, strategy="ddp_notebook", max_epochs=1, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    if kind == "pl_notebook":
        import pytorch_lightning as pl

        make_trainer, module_class = (lambda: pl.Trainer(**options)), _module_class(pl.LightningModule)
    else:
        from trainer import LightningModule, Trainer

        make_trainer, module_class = (lambda: Trainer(**options)), _module_class(LightningModule)
    # torch's lazy import at a process's first optimizer (~1.6 s on an idle core): `import pytorch_lightning`
    # pays it before the timer, ours at the first fit; paid here for both.
    importlib.import_module("torch._dynamo")

    seconds = []
    reused = make_trainer() if kind == "ours_reuse" else None
    for _ in range(fits):
        started = time.perf_counter()
        trainer = reused or make_trainer()
        trainer.fit(module_class(), loader)
        seconds.append(time.perf_counter() - started)
    with open(out, "w") as handle:
        json.dump({"seconds": seconds}, handle)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
