"""A module that splits its batch size by the strategy it runs under, as Lightning's ImageNet example does:
`setup()` divides `batch_size` by `trainer.strategy.num_processes` when `isinstance(trainer.strategy,
ParallelStrategy)`. Run unchanged under Lightning's Trainer or ours:

    python -m tests.conformance.split_batch_program {lightning|ours} PACKAGE PROCESSES OUT_DIR

PACKAGE is the Lightning package the program is written against (`lightning.pytorch` or `pytorch_lightning`);
the other one is hidden (tests/conformance/hidden_package.py). PROCESSES 1 runs `strategy="auto"`, 2 runs
`strategy="ddp"` (Lightning's `ddp` re-runs this script for rank 1; only global rank 0 writes OUT_DIR/result.json).
It fits with a ModelCheckpoint on `val_loss`, then tests the best checkpoint, and records what the caller
holds after each stage: `model.batch_size`, the metrics, the weights, the best checkpoint and the test results;
and, at the end of training, what the module reads from `trainer.strategy` (ranks, devices, the cluster
environment, the sampler's arguments) and what its collectives return (`barrier`, `broadcast`, `reduce`,
`all_gather`).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from tests.conformance.hidden_package import hide_packages

WHICH, PACKAGE, PROCESSES, OUT = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
hide_packages({"lightning.pytorch": "pytorch_lightning", "pytorch_lightning": "lightning"}[PACKAGE])
pl: Any = importlib.import_module(PACKAGE)
ParallelStrategy: Any = importlib.import_module(f"{PACKAGE}.strategies").ParallelStrategy

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def _data(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=generator)
    return TensorDataset(x, x @ torch.linspace(-1, 1, 6).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=generator))


class SplitBatchModel(pl.LightningModule):
    """Lightning's ImageNet example's batch handling on a small regression."""

    def __init__(self, batch_size: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.strategy_was_parallel: list[bool] = []
        self.strategy_reads: dict[str, Any] = {}

    def setup(self, stage: str) -> None:
        parallel = isinstance(self.trainer.strategy, ParallelStrategy)
        self.strategy_was_parallel.append(parallel)
        if parallel:
            num_processes = max(1, self.trainer.strategy.num_processes)
            self.batch_size = int(self.batch_size / num_processes)

    def on_train_end(self) -> None:
        """What a program reads from the strategy, and its collectives, on every rank (rank 0's are compared)."""
        strategy, rank = self.trainer.strategy, self.trainer.global_rank
        read = ["world_size", "global_rank", "local_rank", "is_global_zero", "root_device"]
        if isinstance(strategy, ParallelStrategy):
            read += ["num_processes", "num_nodes", "node_rank", "parallel_devices", "distributed_sampler_kwargs"]
            environment = strategy.cluster_environment
            self.strategy_reads["cluster_environment"] = [
                environment.world_size(), environment.global_rank(), environment.local_rank(),
                environment.node_rank(), environment.creates_processes_externally]
        self.strategy_reads.update({name: str(getattr(strategy, name)) for name in read})
        strategy.barrier("probe")
        def value() -> torch.Tensor:  # a fresh tensor each time: Lightning's reduce overwrites its input (ours does not)
            return torch.tensor([float(rank + 1)])

        self.strategy_reads["collectives"] = {
            "broadcast": strategy.broadcast({"from": rank}), "broadcast_src0": strategy.broadcast(rank, src=0),
            "reduce_mean": strategy.reduce(value()).tolist(),
            "reduce_sum": strategy.reduce(value(), reduce_op="sum").tolist(),
            "all_gather": strategy.all_gather(value()).tolist()}

    def _loss(self, batch: Any) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_data(64, 0), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_data(32, 1), batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(_data(32, 2), batch_size=self.batch_size)


def _trainer_class() -> Any:
    if WHICH == "ours":
        from trainer import Trainer

        return Trainer
    return pl.Trainer


def _metrics(trainer: Any) -> dict[str, float]:
    return {key: round(float(value), 6) for key, value in sorted(trainer.callback_metrics.items())}


def main() -> None:
    pl.seed_everything(7, verbose=False)
    model = SplitBatchModel()
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=str(OUT / "checkpoints"), monitor="val_loss", save_top_k=1)
    trainer = _trainer_class()(accelerator="cpu", devices=PROCESSES, strategy="ddp" if PROCESSES > 1 else "auto",
                               max_epochs=3, logger=False, callbacks=[checkpoint], enable_progress_bar=False,
                               enable_model_summary=False)
    strategies = importlib.import_module(f"{PACKAGE}.strategies")
    kinds = {name: isinstance(trainer.strategy, getattr(strategies, name))
             for name in ("Strategy", "ParallelStrategy", "DDPStrategy", "SingleDeviceStrategy")}
    trainer.fit(model)
    result: dict[str, Any] = {"isinstance": kinds, "after_fit": {
        "batch_size": model.batch_size, "global_step": trainer.global_step, "metrics": _metrics(trainer),
        "weights": [round(float(p.detach().sum()), 6) for p in model.parameters()],
        "best": Path(checkpoint.best_model_path).name, "best_score": round(float(checkpoint.best_model_score), 6)}}
    tested = trainer.test(model, ckpt_path="best", verbose=False)
    result["after_test"] = {"batch_size": model.batch_size, "results": [{k: round(v, 6) for k, v in r.items()}
                                                                          for r in tested]}
    result["strategy_was_parallel"] = model.strategy_was_parallel
    result["strategy_reads"] = model.strategy_reads
    result["loaded"] = sorted(name for name in ("lightning", "pytorch_lightning") if sys.modules.get(name) is not None)
    if trainer.global_rank == 0:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
