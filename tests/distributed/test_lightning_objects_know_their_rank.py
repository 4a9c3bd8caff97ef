"""Lightning's own objects in our workers know which rank they run on: a Lightning logger's
`experiment` is Lightning's dummy on rank 1 (as under Lightning's Trainer), not a second writer.
Run as a user's script that imports Lightning at its top (so the worker processes' parent, which
preloads the script's imports, has read Lightning's rank before any rank existed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers.user_script import run_user_script

SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path

    import pytorch_lightning as pl
    from lightning_fabric.loggers.logger import _DummyExperiment
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.loggers import TensorBoardLogger

    from trainer import Trainer

    OUT = Path(sys.argv[1])


    class Report(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            from lightning_utilities.core.rank_zero import rank_zero_only

            if batch_idx == 0:
                dummy = isinstance(trainer.logger.experiment, _DummyExperiment)
                (OUT / f"rank{trainer.global_rank}.txt").write_text(f"{rank_zero_only.rank} {dummy}")


    if __name__ == "__main__":
        trainer = Trainer(logger=TensorBoardLogger(save_dir=OUT / "logs"), default_root_dir=OUT, strategy="ddp_spawn",
                          accelerator="cpu", devices=2, max_steps=1, callbacks=[Report()], enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(BoringModel())
""")


@pytest.mark.timeout(180)
@pytest.mark.conformance
def test_lightning_logger_on_rank_1_gets_the_dummy_experiment(tmp_path: Path) -> None:
    run_user_script(tmp_path, SCRIPT, str(tmp_path))
    assert (tmp_path / "rank0.txt").read_text() == "0 False"
    assert (tmp_path / "rank1.txt").read_text() == "1 True"
    assert len(list((tmp_path / "logs").rglob("events.out.tfevents.*"))) == 1  # one writer, on rank 0
