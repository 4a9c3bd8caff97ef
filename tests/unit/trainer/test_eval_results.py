"""What `test()`/`validate()` return per dataloader, against Lightning's Trainer."""

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
