"""When fit asks for its dataloaders with `reload_dataloaders_every_n_epochs`, with Lightning's
Trainer as the oracle: the validation loaders count their own epochs (they are requested when a
validation is due), so with `check_val_every_n_epoch` > 1 they reload on their own schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer import Trainer


def _request_epochs(trainer_class: Any, root: Path, sanity: int, check_every: int, reload_every: int) -> dict[str, Any]:
    from pytorch_lightning.demos.boring_classes import BoringModel

    seen: dict[str, list[int]] = {"train": [], "val": [], "sanity_val": [], "val_steps": []}

    class Model(BoringModel):
        def train_dataloader(self) -> Any:
            seen["train"].append(self.current_epoch)
            return super().train_dataloader()

        def val_dataloader(self) -> Any:
            seen["sanity_val" if self.trainer.sanity_checking else "val"].append(self.current_epoch)
            return super().val_dataloader()

        def validation_step(self, *args: Any, **kwargs: Any) -> Any:
            if not self.trainer.sanity_checking:
                seen["val_steps"].append(self.current_epoch)
            return super().validation_step(*args, **kwargs)

    trainer = trainer_class(default_root_dir=root, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False, limit_train_batches=1,
                            limit_val_batches=1, max_epochs=8, num_sanity_val_steps=sanity,
                            check_val_every_n_epoch=check_every, reload_dataloaders_every_n_epochs=reload_every)
    trainer.fit(Model())
    return seen


@pytest.mark.parametrize(("sanity", "check_every", "reload_every"), [
    (0, 3, 4), (1, 3, 4), (1, 1, 2), (0, 2, 1), (1, 3, 2), (1, 2, 0),
])
def test_loader_requests_match_lightning(tmp_path: Path, sanity: int, check_every: int, reload_every: int) -> None:
    import pytorch_lightning as pl

    theirs = _request_epochs(pl.Trainer, tmp_path / "lightning", sanity, check_every, reload_every)
    ours = _request_epochs(Trainer, tmp_path / "ours", sanity, check_every, reload_every)
    assert ours == theirs
