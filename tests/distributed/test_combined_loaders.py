"""Several training loaders on 2 real processes: each member gets its own distributed shard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import LightningModule, Trainer

pytestmark = pytest.mark.timeout(180)


class _RecordsShards(LightningModule):
    """Writes, per rank, the sample values each member loader gave it."""

    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.out_dir = out_dir
        self.weight = nn.Parameter(torch.zeros(1))
        self.seen: dict[str, list[int]] = {"a": [], "b": []}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        for key, (values,) in batch.items():
            self.seen[key] += values.int().tolist()
        return (self.weight * batch["a"][0].float().mean()).sum()

    def on_train_end(self) -> None:
        path = Path(self.out_dir) / f"rank{self.global_rank}.json"
        path.write_text(json.dumps(self.seen))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_each_member_is_sharded_across_ranks(tmp_path: Path) -> None:
    loaders = {"a": DataLoader(TensorDataset(torch.arange(8)), batch_size=2),
               "b": DataLoader(TensorDataset(torch.arange(100, 104)), batch_size=2)}
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path)
    trainer.fit(_RecordsShards(str(tmp_path)), train_dataloaders=loaders)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert sorted(ranks[0]["a"] + ranks[1]["a"]) == list(range(8))  # 'a' split in two, nothing repeated
    assert not set(ranks[0]["a"]) & set(ranks[1]["a"])
    for rank in ranks:  # 'b' (half as long) is cycled to the length of 'a': its shard twice per epoch
        assert len(rank["a"]) == len(rank["b"]) == 4 and rank["b"][:2] == rank["b"][2:]
    assert set(ranks[0]["b"][:2]) | set(ranks[1]["b"][:2]) == {100, 101, 102, 103}
    assert trainer.global_step == 2
