"""Steps that read their own batches (`*_step(self, dataloader_iter)`), against Lightning's Trainer:
how many steps run, how many batches they fetch, what the batch hooks see, in every stage."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset  # noqa: E402

from trainer import Trainer  # noqa: E402

_TRAINERS = {"lightning": pl.Trainer, "ours": Trainer}


class _TwoBatchesPerStep(BoringModel):
    """Each step fetches two micro-batches (a step that prefetches or accumulates by itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.record: dict[str, Counter] = {}
        self.hook_batches: list[tuple[str, int]] = []

    def _shared(self, dataloader_iter: Any, stage: str) -> Any:
        stage = "sanity" if stage == "validation" and self.trainer.sanity_checking else stage
        counts = self.record.setdefault(stage, Counter())
        counts["entered"] += 1
        for _ in range(2):
            try:
                batch, _, _ = next(dataloader_iter)
            except StopIteration:
                counts["ran_out"] += 1
                return None
            counts["fetched"] += 1
        return self.layer(batch).sum()

    def training_step(self, dataloader_iter: Any) -> Any:
        return self._shared(dataloader_iter, "training")

    def validation_step(self, dataloader_iter: Any) -> Any:
        return self._shared(dataloader_iter, "validation")

    def test_step(self, dataloader_iter: Any) -> Any:
        return self._shared(dataloader_iter, "test")

    def predict_step(self, dataloader_iter: Any) -> Any:
        return self._shared(dataloader_iter, "predict")

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.hook_batches.append(("train_end", batch_idx))


@pytest.mark.parametrize("limit", [None, 2, 5])
def test_steps_that_fetch_their_own_batches_run_as_in_lightning(tmp_path: Path, limit: int | None) -> None:
    records = {}
    for name, trainer_class in _TRAINERS.items():
        data = DataLoader(RandomDataset(32, 16), batch_size=2)  # 8 batches
        limits = {} if limit is None else {f"limit_{s}_batches": limit for s in ("train", "val", "test", "predict")}
        trainer = trainer_class(accelerator="cpu", default_root_dir=tmp_path / name, max_epochs=1, logger=False,
                                enable_progress_bar=False,
                                enable_checkpointing=False, enable_model_summary=False, **limits)
        model = _TwoBatchesPerStep()
        trainer.fit(model, data, data)
        trainer.validate(model, data, verbose=False)
        trainer.test(model, data, verbose=False)
        predictions = trainer.predict(model, data)
        records[name] = (model.record, model.hook_batches, trainer.global_step, len(predictions))
    assert records["ours"] == records["lightning"]
    assert records["ours"][0]["training"]["fetched"] == (8 if limit is None else limit)
