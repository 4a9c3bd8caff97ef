"""What `test()`/`validate()` return per dataloader, and what hooks see of each dataloader's
metrics while evaluating, against Lightning's Trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset  # noqa: E402

from trainer import Trainer  # noqa: E402


class _LogsPerDataloader(BoringModel):
    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        self.log_dict({"common": 789.0})
        self.log("differs", dataloader_idx + 1.0)
        self.log(f"own_name_{dataloader_idx}", 321.0 * (dataloader_idx + 1), add_dataloader_idx=False)
        self.log_dict({"only_a": 123.0} if dataloader_idx == 0 else {"only_b": 456.0}, add_dataloader_idx=False)

    def on_test_epoch_end(self) -> None:
        self.log("from_epoch_end", 3.0)  # outside any dataloader: in every dataloader's results

    def test_dataloader(self) -> Any:
        return [torch.utils.data.DataLoader(RandomDataset(32, 8)) for _ in range(2)]


def test_each_dataloader_reports_what_it_logged(tmp_path: Path) -> None:
    results = {name: trainer_class(default_root_dir=tmp_path / name, limit_test_batches=2, logger=False,
                                   enable_progress_bar=False).test(_LogsPerDataloader(), verbose=False)
               for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer))}
    assert results["ours"] == results["lightning"]
    assert "only_b" not in results["ours"][0] and results["ours"][1]["from_epoch_end"] == 3.0


class _TwoSets(BoringModel):
    """Logs from each evaluation dataloader (with and without its index in the name) and from the
    epoch-end hook; the data is fixed at construction, so both Trainers see the same numbers."""

    def __init__(self, loaders: int) -> None:
        super().__init__()
        self.sets = [RandomDataset(32, 8) for _ in range(1 + loaders)]
        self.loaders = loaders

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        loss = self.step(batch)
        self.log("loss", loss)
        self.log(f"loss_of_{dataloader_idx}", loss, add_dataloader_idx=False)
        self.log("both", loss, on_step=True, on_epoch=True)

    test_step = validation_step

    def on_validation_epoch_end(self) -> None:
        self.log("epoch_end", 1.0)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(self.sets[0], batch_size=4)

    def val_dataloader(self) -> Any:
        loaders = [torch.utils.data.DataLoader(data, batch_size=4) for data in self.sets[1:]]
        return loaders if self.loaders > 1 else loaders[0]

    test_dataloader = val_dataloader


class _Seen(pl.Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[str, bool, dict[str, float], list[str]]] = []

    def _record(self, trainer: Any, where: str) -> None:
        metrics = {key: round(float(value), 5) for key, value in trainer.callback_metrics.items()}
        self.seen.append((where, trainer.sanity_checking, metrics, sorted(trainer.logged_metrics)))

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._record(trainer, f"validation batch {dataloader_idx}/{batch_idx}")

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._record(trainer, f"test batch {dataloader_idx}/{batch_idx}")

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._record(trainer, "validation epoch end")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._record(trainer, "validation end")

    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._record(trainer, "test epoch end")


@pytest.mark.parametrize("loaders", [1, 2])
def test_hooks_see_each_dataloaders_metrics_when_lightning_shows_them(tmp_path: Path, loaders: int) -> None:
    """Lightning's rule: with several dataloaders a dataloader's epoch values appear once it is done
    (so hooks during dataloader 1 read dataloader 0's), except in the sanity check, whose
    on_validation_epoch_end shows none of them; with one dataloader, the sanity check's epoch end
    shows its values."""
    seen = {}
    for name, trainer_class in (("lightning", pl.Trainer), ("ours", Trainer)):
        torch.manual_seed(0)
        module, callback = _TwoSets(loaders), _Seen()
        trainer = trainer_class(default_root_dir=tmp_path / name, max_epochs=1, logger=False, callbacks=[callback],
                                enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
        trainer.fit(module)
        trainer.validate(module, verbose=False)
        trainer.test(module, verbose=False)
        seen[name] = callback.seen
    assert seen["ours"] == seen["lightning"]
    sanity_end = next(metrics for where, sanity, metrics, _ in seen["ours"] if sanity and where.endswith("epoch end"))
    assert bool(sanity_end) == (loaders == 1)
    if loaders == 2:
        second_loader = next(metrics for where, sanity, metrics, _ in seen["ours"]
                             if where == "test batch 1/0")
        assert set(second_loader) == {"loss/dataloader_idx_0", "loss_of_0", "both/dataloader_idx_0",
                                      "both_epoch/dataloader_idx_0"}
