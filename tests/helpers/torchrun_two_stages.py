"""Run under torchrun: fit, then test, then fit again in one process (each rank)."""

from __future__ import annotations

import sys

from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer


def main() -> None:
    model, data = TinyRegressor(), RegressionData()
    for _ in range(2):
        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(model, datamodule=data)
        result = trainer.test(model, datamodule=data)
    print(f"rank {trainer.global_rank} done test_loss={result[0]['test_loss']:.6f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
