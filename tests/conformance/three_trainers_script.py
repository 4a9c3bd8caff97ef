"""A tutorial's pattern, unchanged between Trainers: one script fits three models of different widths
with three Trainers (`strategy="ddp"`, 2 CPU processes), each logging to its own CSV file. Global
rank 0 writes each fit's weights and logged epochs to OUT_DIR/fits.json.

    python -m tests.conformance.three_trainers_script {ours|lightning|pytorch_lightning} OUT_DIR

"ours" runs our Trainer on unchanged `pytorch_lightning` modules; "lightning" and "pytorch_lightning"
run that package's own Trainer. Under Lightning's `ddp` rank 1 runs this script once and serves all
three Trainers; under ours rank 1 is forked per stage or kept in the process's pool.
"""

from __future__ import annotations

import csv
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WIDTHS = (4, 8, 16)


def _package(kind: str) -> Any:
    return importlib.import_module("lightning.pytorch" if kind == "lightning" else "pytorch_lightning")


def _module_class(pl: Any) -> type:
    class Regressor(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self, width: int) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]), sync_dist=True)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regressor


def _loaders() -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(64, 6, generator=generator)
    y = x @ torch.linspace(-1, 1, 6).unsqueeze(1) + 0.1
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True), DataLoader(TensorDataset(x, y), batch_size=8)


def _trainer(kind: str, pl: Any, out: Path, width: int) -> Any:
    logger = pl.loggers.CSVLogger(str(out), name=f"width{width}", version=0)
    options = dict(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=logger,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   num_sanity_val_steps=0)
    if kind == "ours":
        from trainer import Trainer

        return Trainer(**options)
    return pl.Trainer(**options)


def _logged_epochs(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return [{key: value for key, value in row.items() if value != "" and key != "step"}
                for row in csv.DictReader(handle)]


def main(kind: str, out: Path) -> None:
    pl = _package(kind)
    module_class = _module_class(pl)
    fits: dict[str, Any] = {}
    for width in WIDTHS:
        pl.seed_everything(7)
        model = module_class(width)
        trainer = _trainer(kind, pl, out, width)
        started = time.perf_counter()
        trainer.fit(model, *_loaders())
        seconds = time.perf_counter() - started
        if trainer.global_rank == 0:
            fits[str(width)] = {"weights": {name: tensor.tolist() for name, tensor in model.state_dict().items()},
                                "seconds": seconds, "global_step": trainer.global_step}
    if fits:
        for width in WIDTHS:
            fits[str(width)]["logged"] = _logged_epochs(out / f"width{width}" / "version_0" / "metrics.csv")
        Path(out, "fits.json").write_text(json.dumps(fits))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
