"""The fit-then-test job with our Trainer (`strategy="ddp"`): at this checkout, or at the one before
#17 when the harness puts that checkout's `trainer` and `strategies` first on the path."""

from __future__ import annotations

from typing import Any

from benchmarks.contenders.data import loader
from benchmarks.contenders.ours_parts import BenchModule
from benchmarks.contenders.stages_parts import (BIG_MLP, BIG_STEPS, DIGITS_EPOCHS, RANKS, BigSteps, DigitsTestStep,
                                                digits_data, digits_hparams, trainer_settings)
from trainer import Trainer
from trainer.demos.digits import DigitsClassifier, DigitsDataModule


class StagesDigits(DigitsTestStep, DigitsClassifier):
    pass


class StagesDigitsData(DigitsDataModule):
    def test_dataloader(self) -> Any:
        return self.val_dataloader()


class StagesBig(BigSteps, BenchModule):
    pass


def job(workload: str, out: str, epochs: int | None = None) -> tuple[Trainer, Any, dict[str, Any], dict[str, Any]]:
    """(trainer, module, fit's data arguments, test's data arguments)."""
    if workload.startswith("digits"):
        data = StagesDigitsData(**digits_data(workload))
        return (Trainer(max_epochs=epochs or DIGITS_EPOCHS, **trainer_settings(out)),
                StagesDigits(**digits_hparams(DigitsClassifier)), {"datamodule": data}, {"datamodule": data})
    batches = loader(BIG_MLP, BIG_STEPS, RANKS)
    return (Trainer(max_epochs=1, **trainer_settings(out)), StagesBig(BIG_MLP),
            {"train_dataloaders": batches}, {"dataloaders": batches})
