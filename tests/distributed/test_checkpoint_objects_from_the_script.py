"""A callback whose state holds an object of a class defined in the user's script, on 2 processes of
our launcher: the workers receive that class by value, so pickling it by name in a checkpoint failed
("not the same object as __main__.Record") and the fit died at its first save. The checkpoint is now
written, and a resume with weights_only=False (the user trusts the file) restores the state."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers.user_script import run_user_script

SCRIPT = textwrap.dedent("""
    import sys
    from dataclasses import dataclass
    from pathlib import Path

    from trainer import Trainer
    from trainer.callbacks import Callback
    from tests.helpers.models import RegressionData, TinyRegressor

    OUT = Path(sys.argv[1])


    @dataclass
    class Record:
        batches: int


    class Counting(Callback):
        def __init__(self):
            self.record = Record(0)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.record = Record(self.record.batches + 1)

        def state_dict(self):
            return {"record": self.record}

        def load_state_dict(self, state_dict):
            self.record = state_dict["record"]

        def on_train_end(self, trainer, pl_module):
            if trainer.is_global_zero:
                (OUT / f"batches-{trainer.current_epoch}.txt").write_text(str(self.record.batches))


    def trainer(epochs):
        return Trainer(default_root_dir=OUT, accelerator="cpu", devices=2, strategy="ddp", max_epochs=epochs,
                       limit_train_batches=2, limit_val_batches=1, logger=False, enable_progress_bar=False,
                       enable_model_summary=False, callbacks=[Counting()])


    if __name__ == "__main__":
        first = trainer(1)
        first.fit(TinyRegressor(), datamodule=RegressionData())
        trainer(2).fit(TinyRegressor(), datamodule=RegressionData(), ckpt_path=first.checkpoint_callback.best_model_path,
                       weights_only=False)
""")


@pytest.mark.timeout(240)
@pytest.mark.conformance
def test_a_scripts_own_class_in_a_checkpoint_saves_and_resumes(tmp_path: Path) -> None:
    run_user_script(tmp_path, SCRIPT, str(tmp_path), timeout_s=200)
    assert (tmp_path / "batches-1.txt").read_text() == "2"  # the first fit's 2 batches
    assert (tmp_path / "batches-2.txt").read_text() == "4"  # restored, then 2 more
