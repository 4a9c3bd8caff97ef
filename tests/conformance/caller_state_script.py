"""One unchanged Lightning program, run as a script under `pytorch_lightning.Trainer` or ours, on 2
CPU processes with `strategy="ddp"`: after each stage (fit, validate, test, predict, a second fit)
the calling process writes what it holds to a JSON file, so the two Trainers can be compared.

    python -m tests.conformance.caller_state_script {lightning|ours} {lightning|ours} OUT_DIR

The first word picks the Trainer, the second the callbacks and logger (Lightning's or ours; with
Lightning's Trainer always Lightning's). Under Lightning's `ddp` this script runs again for rank 1
(Lightning starts its ranks by re-running the command line), so only global rank 0 writes.
"""

from __future__ import annotations

import csv
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Shifted(Dataset):
    """Regression data a process generates itself (nothing downloads)."""

    def __init__(self, n: int = 48) -> None:
        generator = torch.Generator().manual_seed(3)
        self.x = torch.randn(n, 6, generator=generator)
        self.y = self.x @ torch.linspace(-1, 1, 6).unsqueeze(1) + 0.1

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


class Regressor(pl.LightningModule):
    """A tutorial-style module: it sets attributes on itself while it runs, as real ones do."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Tanh(), nn.Linear(8, 1))
        self.fit_ends = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True, prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0])

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        self.lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler}

    def on_fit_end(self) -> None:
        self.fit_ends += 1


class Counting(pl.Callback):
    """Lightning's Callback API: counters a user reads after the stage."""

    def __init__(self) -> None:
        self.batches = 0
        self.val_ends = 0
        self.fit_ended = False
        self.stages: list[str] = []

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.stages.append(stage)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.val_ends += 1

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.fit_ended = True


def _objects(kind: str, root: Path) -> tuple[Any, Any]:
    if kind == "lightning":
        from pytorch_lightning.callbacks import ModelCheckpoint
        from pytorch_lightning.loggers import CSVLogger
    else:
        from trainer.callbacks import ModelCheckpoint  # type: ignore[assignment]
        from trainer.loggers import CSVLogger  # type: ignore[assignment]
    return ModelCheckpoint(monitor="val_loss", save_last=True), CSVLogger(str(root), name="logs")


def _trainer_class(kind: str) -> Any:
    if kind == "lightning":
        return pl.Trainer
    from trainer import Trainer

    return Trainer


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    return {key: round(float(value), 6) for key, value in sorted(metrics.items())}


def _csv_rows(logger: Any, root: Path) -> list[dict[str, str]]:
    path = Path(logger.log_dir, "metrics.csv")
    if not path.exists():
        return []
    with path.open() as handle:
        return [{k: v for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)]


def _relative(path: Any, root: Path) -> str | None:
    return os.path.relpath(path, root) if path else None


def snapshot(trainer: Any, model: Regressor, counting: Counting, checkpoint: Any, kept: dict[str, Any],
             root: Path) -> dict[str, Any]:
    """What the calling process holds after a stage, in plain values."""
    return {
        "callback": {"batches": counting.batches, "val_ends": counting.val_ends, "fit_ended": counting.fit_ended,
                     "stages": list(counting.stages)},
        "module": {"fit_ends": model.fit_ends, "has_lr_scheduler": hasattr(model, "lr_scheduler"),
                   "attached": model._trainer is trainer,
                   "weights": [round(float(p.detach().double().sum()), 5) for p in model.parameters()]},
        "trainer": {"optimizers": [type(o).__name__ for o in trainer.optimizers],
                    "lrs": [round(group["lr"], 6) for o in trainer.optimizers for group in o.param_groups],
                    "schedulers": len(trainer.lr_scheduler_configs), "global_step": trainer.global_step,
                    "current_epoch": trainer.current_epoch, "lightning_module": trainer.lightning_module is model,
                    "world_size": trainer.world_size, "global_rank": trainer.global_rank},
        "metrics": {"callback": _floats(trainer.callback_metrics), "logged": _floats(trainer.logged_metrics),
                    "progress_bar": _floats(trainer.progress_bar_metrics), "kept_from_fit": _floats(kept)},
        "checkpoint": {"best_model_score": None if checkpoint.best_model_score is None
                       else round(float(checkpoint.best_model_score), 6),
                       "best_model_path": _relative(checkpoint.best_model_path, root),
                       "last_model_path": _relative(checkpoint.last_model_path, root)},
        "csv_rows": _csv_rows(trainer.logger, root),
        "random": {"torch": round(torch.rand(1).item(), 8), "python": round(random.random(), 8),
                   "numpy": round(float(np.random.rand()), 8)},
    }


def main(trainer_kind: str, objects_kind: str, out: Path) -> None:
    pl.seed_everything(7)
    checkpoint, logger = _objects(objects_kind, out)
    counting = Counting()
    make = _trainer_class(trainer_kind)
    trainer = make(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, callbacks=[counting, checkpoint],
                   logger=logger, enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                   default_root_dir=str(out))
    model = Regressor()
    loader = DataLoader(Shifted(), batch_size=6, shuffle=True)
    snapshots: dict[str, Any] = {}
    trainer.fit(model, loader, DataLoader(Shifted(), batch_size=6))
    kept = trainer.callback_metrics  # a script keeps the fit's dict and reads it later
    snapshots["fit"] = snapshot(trainer, model, counting, checkpoint, kept, out)
    snapshots["validate_result"] = trainer.validate(model, DataLoader(Shifted(), batch_size=6), verbose=False)
    snapshots["validate"] = snapshot(trainer, model, counting, checkpoint, kept, out)
    snapshots["test_result"] = trainer.test(model, DataLoader(Shifted(), batch_size=6), verbose=False)
    snapshots["test"] = snapshot(trainer, model, counting, checkpoint, kept, out)
    predictions = trainer.predict(model, DataLoader(Shifted(), batch_size=6))
    snapshots["predict_result"] = [round(float(p.sum()), 5) for p in predictions]
    snapshots["predict"] = snapshot(trainer, model, counting, checkpoint, kept, out)
    trainer.fit_loop.max_epochs = 3
    trainer.fit(model, loader, DataLoader(Shifted(), batch_size=6))
    snapshots["fit_again"] = snapshot(trainer, model, counting, checkpoint, kept, out)
    if trainer.global_rank == 0:
        Path(out, "caller.json").write_text(json.dumps(snapshots, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
