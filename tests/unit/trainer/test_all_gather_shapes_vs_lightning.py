"""On one process, `self.all_gather` keeps Lightning's shapes: no rank dimension without a process
group (single device), a rank dimension of 1 with our DDP in place (Lightning's DDP has a group too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos.boring_classes import BoringModel  # noqa: E402

from trainer import Trainer  # noqa: E402


class Gathering(BoringModel):
    def on_train_start(self) -> None:
        gathered = self.all_gather({"x": torch.ones(2), "n": 3, "nested": [torch.zeros(1, 2)]})
        self.shapes = [tuple(gathered["x"].shape), tuple(gathered["n"].shape), tuple(gathered["nested"][0].shape)]
        self.reduced = float(self.trainer.strategy.reduce(torch.tensor(2.0), reduce_op="sum"))


def _shapes(trainer_class: type, tmp_path: Path, **kwargs: Any) -> tuple[list[tuple[int, ...]], float]:
    model = Gathering()
    trainer_class(default_root_dir=tmp_path, max_steps=1, logger=False, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=False, accelerator="cpu", devices=1,
                  **kwargs).fit(model)
    return model.shapes, model.reduced


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_shapes_on_one_process_match_lightning(tmp_path: Path, strategy: str) -> None:
    ours = _shapes(Trainer, tmp_path / "ours", strategy=strategy)
    try:
        lightning = _shapes(pl.Trainer, tmp_path / "pl", strategy=strategy)
    finally:
        if torch.distributed.is_initialized():  # Lightning's in-process DDP leaves its group behind
            torch.distributed.destroy_process_group()
    assert ours == lightning


class SubgroupCollective(BoringModel):
    def on_train_start(self) -> None:
        subgroup = torch.distributed.new_group([0])
        try:
            self.trainer.strategy.reduce(torch.ones(1), group=subgroup)
        except ValueError as error:
            self.refused = str(error)
        self.world_ok = float(self.trainer.strategy.reduce(torch.ones(1), group=torch.distributed.group.WORLD))


def test_only_the_default_group_is_accepted(tmp_path: Path) -> None:
    """Our hang guard expects every rank in every collective, so a subgroup is refused, not run."""
    model = SubgroupCollective()
    Trainer(default_root_dir=tmp_path, max_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, accelerator="cpu", devices=1, strategy="ddp").fit(model)
    assert "a subgroup is not supported" in model.refused and model.world_ok == 1.0


def test_a_reduction_in_the_groups_place_is_refused_naming_the_fix(tmp_path: Path) -> None:
    trainer = Trainer(default_root_dir=tmp_path, accelerator="cpu", devices=1)
    with pytest.raises(TypeError, match=r"reduce\(tensor, reduce_op='sum'\)"):
        trainer.strategy.reduce(torch.ones(1), "sum")
    with pytest.raises(ValueError, match="reduce_op='prod' is not supported"):
        trainer.strategy.reduce(torch.ones(1), reduce_op="prod")
