"""The fit-then-test job with `pytorch_lightning.Trainer(strategy="ddp")`.

Lightning's Trainer takes only its own LightningModule/DataModule, so the digits classifier and
its data are twins: the network, metric and hyperparameters are built by our `DigitsClassifier`
and `DigitsDataModule` themselves, and every step is theirs (the same functions, bound here).
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from benchmarks.contenders.data import loader
from benchmarks.contenders.lightning_parts import BenchModule
from benchmarks.contenders.stages_parts import (BIG_MLP, BIG_STEPS, DIGITS_EPOCHS, RANKS, BigSteps, DigitsTestStep,
                                                digits_data, digits_hparams, trainer_settings)
from trainer.demos.digits import DigitsClassifier, DigitsDataModule


class LightningDigits(DigitsTestStep, pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        source = DigitsClassifier(**digits_hparams(DigitsClassifier))
        self.net, self.val_acc = source.net, source.val_acc
        self.save_hyperparameters(dict(source.hparams))

    forward = DigitsClassifier.forward
    training_step = DigitsClassifier.training_step
    validation_step = DigitsClassifier.validation_step
    configure_optimizers = DigitsClassifier.configure_optimizers


class LightningDigitsData(pl.LightningDataModule):
    def __init__(self, workload: str = "digits") -> None:
        super().__init__()
        self.source = DigitsDataModule(**digits_data(workload))

    def setup(self, stage: str) -> None:
        self.source.setup(stage)

    def train_dataloader(self) -> Any:
        return self.source.train_dataloader()

    def val_dataloader(self) -> Any:
        return self.source.val_dataloader()

    def test_dataloader(self) -> Any:
        return self.source.val_dataloader()


class LightningBig(BigSteps, BenchModule):
    pass


def job(workload: str, out: str, epochs: int | None = None) -> tuple[pl.Trainer, Any, dict[str, Any], dict[str, Any]]:
    """(trainer, module, fit's data arguments, test's data arguments)."""
    if workload.startswith("digits"):
        data = LightningDigitsData(workload)
        return (pl.Trainer(max_epochs=epochs or DIGITS_EPOCHS, **trainer_settings(out)), LightningDigits(),
                {"datamodule": data}, {"datamodule": data})
    batches = loader(BIG_MLP, BIG_STEPS, RANKS)
    return (pl.Trainer(max_epochs=1, **trainer_settings(out)), LightningBig(BIG_MLP),
            {"train_dataloaders": batches}, {"dataloaders": batches})
