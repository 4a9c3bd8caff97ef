"""A program written against one Lightning package, with the other one hidden (as if not installed):

    python -m tests.conformance.one_package_program {ours|plugin} PACKAGE PROCESSES OUT_DIR

`ours` fits with our Trainer and Lightning's callbacks (ModelCheckpoint, EarlyStopping, a BaseFinetuning
subclass), Lightning's CSVLogger and SimpleProfiler, a Lightning LightningDataModule, and reloads the best
checkpoint with the module's `load_from_checkpoint`; `plugin` fits with our reducer plugged into the package's
own Trainer (`strategies.lightning` for `pytorch_lightning`, `strategies.lightning.unified` for
`lightning.pytorch`; its `ddp` launcher re-runs this command line for rank 1, hence one Trainer per run).
Global rank 0 writes OUT_DIR/WHAT.json.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from tests.conformance.hidden_package import hide_packages

WHAT, PACKAGE, PROCESSES, OUT = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
hide_packages({"lightning.pytorch": "pytorch_lightning", "pytorch_lightning": "lightning"}[PACKAGE])
pl: Any = importlib.import_module(PACKAGE)

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Data(pl.LightningDataModule):
    def _loader(self, seed: int) -> DataLoader:
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(seed))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    def train_dataloader(self) -> DataLoader:
        return self._loader(0)

    def val_dataloader(self) -> DataLoader:
        return self._loader(1)


class Model(pl.LightningModule):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = torch.nn.Linear(4, hidden)
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.backbone(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.05)


class FreezeBackboneFirst(pl.callbacks.BaseFinetuning):
    """Lightning's documented finetuning callback: the backbone trains from the second epoch."""

    def freeze_before_training(self, pl_module: Any) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        if epoch == 1:
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer)


def _fit_with_ours() -> dict[str, Any]:
    from trainer import Trainer

    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=str(OUT / "ours"), monitor="val_loss")
    trainer = Trainer(accelerator="cpu", devices=PROCESSES, strategy="ddp" if PROCESSES > 1 else "auto",
                      max_epochs=2, default_root_dir=str(OUT), enable_progress_bar=False,
                      logger=pl.loggers.CSVLogger(str(OUT), name="csv"), profiler=pl.profilers.SimpleProfiler(),
                      callbacks=[checkpoint, pl.callbacks.EarlyStopping(monitor="val_loss"), FreezeBackboneFirst()])
    pl.seed_everything(5, verbose=False)
    model = Model()
    trainer.fit(model, datamodule=Data())
    reloaded = Model.load_from_checkpoint(checkpoint.best_model_path)
    saved = torch.load(checkpoint.best_model_path, weights_only=True)["state_dict"]
    same = saved.keys() == reloaded.state_dict().keys() and all(
        torch.equal(saved[key], value) for key, value in reloaded.state_dict().items())
    return {"global_step": trainer.global_step, "rank": trainer.global_rank, "best_reloads_equal": same,
            "reloaded_hparams": dict(reloaded.hparams), "metrics_file": (Path(trainer.logger.log_dir) / "metrics.csv").is_file(),
            "strategy_is_lightnings": isinstance(trainer.strategy, pl.strategies.Strategy)}


def _fit_with_the_plugin() -> dict[str, Any]:
    plugin = importlib.import_module("strategies.lightning.unified" if PACKAGE == "lightning.pytorch"
                                     else "strategies.lightning")
    trainer = pl.Trainer(accelerator="cpu", devices=PROCESSES, strategy=plugin.LightningDDPStrategy(), max_epochs=1,
                         default_root_dir=str(OUT / "plugin"), enable_progress_bar=False, logger=False,
                         enable_checkpointing=False)
    pl.seed_everything(5, verbose=False)
    trainer.fit(Model(), datamodule=Data())
    return {"global_step": trainer.global_step, "rank": trainer.global_rank,
            "strategy": type(trainer.strategy).__name__, "strategy_base": type(trainer.strategy).__mro__[1].__module__}


def main() -> None:
    result = _fit_with_ours() if WHAT == "ours" else _fit_with_the_plugin()
    if result["rank"] == 0:
        loaded = sorted(name for name in ("lightning", "pytorch_lightning") if sys.modules.get(name) is not None)
        (OUT / f"{WHAT}.json").write_text(json.dumps({**result, "loaded": loaded}))


if __name__ == "__main__":
    main()
