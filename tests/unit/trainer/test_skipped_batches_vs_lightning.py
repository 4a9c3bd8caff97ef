"""Batches that train nothing, under Lightning's Trainer and ours: a `training_step` returning None
(warned in automatic optimization only) and a training dataloader yielding None (skipped, with
a warning: no batch-start hook, no step, `on_train_batch_end` gets outputs=None)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, default_collate

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset  # noqa: E402
from lightning.pytorch.loops.optimization.automatic import Closure  # noqa: E402

from trainer import Trainer  # noqa: E402

class _Recording(BoringModel):
    """Records the training hooks and steps; `return_none` makes training_step return nothing,
    `none_batches` makes every other batch None."""

    def __init__(self, return_none: bool = False, manual: bool = False, none_batches: bool = False) -> None:
        super().__init__()
        self.return_none, self.none_batches = return_none, none_batches
        self.automatic_optimization = not manual
        self.events: list[tuple[Any, ...]] = []
        self.collated = 0

    def _collate(self, samples: list[Any]) -> Any:
        self.collated += 1
        return None if self.none_batches and self.collated % 2 == 1 else default_collate(samples)

    def train_dataloader(self) -> Any:
        return DataLoader(RandomDataset(32, 8), batch_size=2, collate_fn=self._collate)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.events.append(("start", batch_idx))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.events.append(("step", batch_idx))
        if not self.automatic_optimization:
            optimizer = self.optimizers()
            loss = self.step(batch)
            self.manual_backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            return None if self.return_none else loss
        output = super().training_step(batch, batch_idx)
        return None if self.return_none else output

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.events.append(("end", batch_idx, outputs is None, batch is None))


def _fit(trainer_class: Any, root: Path, **module_kwargs: Any) -> tuple[list[Any], int, list[str]]:
    module = _Recording(**module_kwargs)
    trainer = trainer_class(default_root_dir=root, max_epochs=1, limit_val_batches=0, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    Closure.warning_cache.clear()  # Lightning warns once per process: forget earlier tests' warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module)
    about_none = sorted({("training_step" if "training_step" in str(w.message).split("None")[0] else "dataloader")
                         for w in caught if "None" in str(w.message) and issubclass(w.category, UserWarning)
                         and ("training_step" in str(w.message) or "train_dataloader" in str(w.message))})
    return module.events, trainer.global_step, about_none


@pytest.mark.parametrize("module_kwargs, warned", [
    ({"return_none": True}, ["training_step"]),
    ({"return_none": True, "manual": True}, []),  # manual optimization: returning nothing is normal
    ({}, []),
])
def test_training_step_returning_none_warns_as_in_lightning(tmp_path: Path, module_kwargs: dict[str, Any],
                                                            warned: list[str]) -> None:
    lightning = _fit(pl.Trainer, tmp_path / "lightning", **module_kwargs)
    ours = _fit(Trainer, tmp_path / "ours", **module_kwargs)
    assert ours == lightning
    assert ours[2] == warned


def test_a_none_batch_is_skipped_and_warned_as_in_lightning(tmp_path: Path) -> None:
    lightning = _fit(pl.Trainer, tmp_path / "lightning", none_batches=True)
    ours = _fit(Trainer, tmp_path / "ours", none_batches=True)
    assert ours == lightning
    events, steps, warned = ours
    assert ("start", 0) not in events and ("end", 0, True, True) in events and steps == 2
    assert warned == ["dataloader"]
