"""Run under torchrun: fit, test, fit, test in one process per rank; write the last test loss."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer


def main() -> None:
    model, data = TinyRegressor(), RegressionData()
    for _ in range(2):
        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(model, datamodule=data)
        result = trainer.test(model, datamodule=data)
    # One file per rank: two ranks printing to one stdout can interleave mid-line.
    Path(sys.argv[1], f"rank{trainer.global_rank}.txt").write_text(f"{result[0]['test_loss']:.6f}")


if __name__ == "__main__":
    main()
