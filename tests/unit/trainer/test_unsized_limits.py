"""`limit_*_batches` on loaders without a length (an IterableDataset, or `__len__` raising
NotImplementedError), with Lightning's Trainer as the oracle: an int or 1.0 bounds or runs them, a
fraction of them is refused before anything runs (Lightning raises too), 0.0 runs none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from trainer import Trainer

STAGES = {"train": "fit", "val": "validate", "test": "test", "predict": "predict"}


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.randn(12, 32))


class NoLength(DataLoader):  # type: ignore[type-arg]
    def __len__(self) -> int:
        raise NotImplementedError


def _run(trainer_class: Any, root: Path, stage: str, limit: float | int, sized_but_unknown: bool) -> Any:
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    model = BoringModel()
    loader = (lambda: NoLength(RandomDataset(32, 12))) if sized_but_unknown else (lambda: DataLoader(Stream()))
    setattr(model, f"{stage}_dataloader", loader)
    trainer = trainer_class(default_root_dir=root, accelerator="cpu", devices=1, max_epochs=1, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                            num_sanity_val_steps=0, **{f"limit_{stage}_batches": limit})
    try:
        getattr(trainer, STAGES[stage])(model)
    except Exception as error:  # noqa: BLE001 - the outcome compared is "refused"
        return type(error).__name__, str(error)
    return "ran", trainer.global_step


@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("sized_but_unknown", [False, True])
def test_limits_of_unsized_loaders_as_in_lightning(tmp_path: Path, stage: str, sized_but_unknown: bool) -> None:
    import pytorch_lightning as pl

    for limit in (0.5, 1.0, 0.0, 3):
        theirs = _run(pl.Trainer, tmp_path / "pl", stage, limit, sized_but_unknown)
        ours = _run(Trainer, tmp_path / "ours", stage, limit, sized_but_unknown)
        assert (theirs[0] == "ran") == (limit != 0.5), (limit, theirs)  # Lightning refuses only the fraction
        if theirs[0] == "ran":
            assert ours == theirs, (limit, ours, theirs)
        else:
            assert ours[0] == "ValueError" and f"limit_{stage}_batches={limit} is a fraction" in ours[1], (limit, ours)
