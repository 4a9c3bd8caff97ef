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


@pytest.mark.parametrize("use_batch_sampler", [False, True])
def test_set_epoch_once_per_epoch_and_per_evaluation_as_lightning(tmp_path: Path, use_batch_sampler: bool) -> None:
    from unittest.mock import Mock

    from lightning.pytorch.demos.boring_classes import RandomDataset
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    def loader() -> DataLoader:
        dataset = RandomDataset(32, 64)
        sampler = RandomSampler(dataset)
        sampler.set_epoch = Mock()  # type: ignore[attr-defined]
        if use_batch_sampler:
            return DataLoader(dataset, batch_sampler=BatchSampler(sampler, 2, True))
        return DataLoader(dataset, sampler=sampler)

    def sampler_of(data: DataLoader) -> Any:
        return data.batch_sampler.sampler if use_batch_sampler else data.sampler  # type: ignore[union-attr]

    calls = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        trainer = trainer_class(default_root_dir=tmp_path, limit_train_batches=1, limit_val_batches=1, max_epochs=2,
                                enable_model_summary=False, enable_checkpointing=False, logger=False,
                                enable_progress_bar=False)
        train, val, again = loader(), loader(), loader()
        trainer.fit(BoringModel(), train_dataloaders=train, val_dataloaders=val)
        trainer.validate(BoringModel(), again, verbose=False)
        calls[name] = [sampler_of(data).set_epoch.mock_calls for data in (train, val, again)]
    assert calls["ours"] == calls["lightning"]
