"""Where a stage's dataloaders come from: a hook that forgets to return its loader fails, as in Lightning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402

from trainer import Trainer  # noqa: E402


class _ForgetsToReturn(BoringModel):
    def val_dataloader(self) -> Any:
        super().val_dataloader()  # built, never returned


@pytest.mark.parametrize("trainer_class", [pl.Trainer, Trainer], ids=["lightning", "ours"])
def test_a_hook_returning_none_is_an_error_naming_it(tmp_path: Path, trainer_class: type) -> None:
    trainer = trainer_class(default_root_dir=tmp_path, max_epochs=1, logger=False, enable_progress_bar=False)
    with pytest.raises(TypeError, match="val_dataloader"):
        trainer.fit(_ForgetsToReturn())


def test_disabling_the_hook_on_the_instance_skips_validation(tmp_path: Path) -> None:
    model = BoringModel()
    model.val_dataloader = None  # Lightning's documented way
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=2, logger=False,
                      enable_progress_bar=False)
    trainer.fit(model)
    assert trainer.num_val_batches == [] and trainer.global_step == 2
