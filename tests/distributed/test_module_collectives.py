"""A module's collectives on 2 processes, against Lightning's Trainer: `self.all_gather` of a nested
collection (numbers become tensors; each tensor gets a leading rank dimension), with `sync_grads=True`
(gradients flow back through the gather), and `trainer.strategy.reduce(..., reduce_op=...)` with
Lightning's spellings. Run as a user's script: an unchanged `pytorch_lightning` module under both
Trainers, and the same code on our own LightningModule."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.helpers.user_script import run_user_script

SCRIPT = textwrap.dedent("""
    import json
    import sys
    from pathlib import Path

    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader

    import trainer as ours

    KIND, OUT = sys.argv[1], Path(sys.argv[2])
    Base = ours.LightningModule if KIND == "our-module" else pl.LightningModule


    class Gathering(Base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(torch.ones(4, 2), batch_size=2)

        def on_train_start(self):
            rank = self.global_rank
            gathered = self.all_gather({"x": torch.tensor([rank, rank * 10.0]), "n": rank + 1, "tag": "kept"})
            weight = torch.tensor([rank + 1.0], requires_grad=True)
            self.all_gather(weight * 3, sync_grads=True).sum().backward()
            strategy = self.trainer.strategy
            result = {
                "x": gathered["x"].tolist(), "n": gathered["n"].tolist(), "tag": gathered["tag"],
                "grad": weight.grad.tolist(),
                "sum": strategy.reduce(torch.tensor(rank + 1.0), reduce_op="sum").item(),
                "mean": strategy.reduce(torch.tensor(rank + 1.0)).item(),
                "max": strategy.reduce(torch.tensor(rank + 1.0), None, torch.distributed.ReduceOp.MAX).item(),
                "avg": strategy.reduce(torch.tensor([rank + 1.0, 4.0]), reduce_op="avg").tolist(),
                "not_a_tensor": strategy.reduce("text", reduce_op="sum"),
            }
            (OUT / f"{KIND}-rank{rank}.json").write_text(json.dumps(result))


    if __name__ == "__main__":
        Trainer = pl.Trainer if KIND == "lightning" else ours.Trainer
        trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=1, logger=False,
                          enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                          default_root_dir=OUT)
        trainer.fit(Gathering())
        if torch.distributed.is_initialized():  # Lightning's ranks keep their group; gloo may abort at exit without this
            torch.distributed.destroy_process_group()
""")


def _run(tmp_path: Path, kind: str) -> list[dict]:
    run_user_script(tmp_path, SCRIPT, kind, str(tmp_path))
    return [json.loads((tmp_path / f"{kind}-rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.timeout(300)
@pytest.mark.conformance
def test_all_gather_and_reduce_match_lightnings_trainer(tmp_path: Path) -> None:
    lightning = _run(tmp_path, "lightning")
    assert lightning[1]["x"] == [[0.0, 0.0], [1.0, 10.0]] and lightning[0]["grad"] == [6.0]  # the oracle's reading
    assert _run(tmp_path, "ours") == lightning
    assert _run(tmp_path, "our-module") == lightning
