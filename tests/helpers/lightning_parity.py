"""Run under torchrun (2 ranks, gloo): fit Lightning's demo modules, write what the tests compare.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/helpers/lightning_parity.py MODE OUT_DIR

MODE "parity": every case is fitted by `pytorch_lightning.Trainer` twice in the same processes,
with Lightning's own `strategy="ddp"` and with our `LightningDDPStrategy`. MODE "ours": our
`trainer.Trainer` fits unchanged `pytorch_lightning.demos` modules. MODE "buffers": a BatchNorm
module validated while fitting, under Lightning's "ddp" and ours, with what every rank saw. Torchrun starts the ranks
once for all cases, so the Lightning imports are paid once, and neither Trainer re-runs pytest.
Global rank 0 writes `OUT_DIR/MODE.pt` (weights-only loadable).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.demos import BoringModel, DemoModel, LightningTransformer
from pytorch_lightning.demos.boring_classes import ManualOptimBoringModel
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from strategies.lightning import LightningDDPStrategy, ReducedModule

VOCAB, SEQ = 64, 8


class TokenTransformer(LightningTransformer):
    """Lightning's demo transformer fed generated tokens (its own data hooks download WikiText2)."""

    def __init__(self) -> None:
        super().__init__(vocab_size=VOCAB)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def prepare_data(self) -> None:
        pass

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(), batch_size=4)


class EvaluatedDemoModel(DemoModel):
    """DemoModel with validation and test loops that log with `sync_dist=True`."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self(batch).sum(), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", self(batch).sum(), sync_dist=True)


class ManualAccumulation(ManualOptimBoringModel):
    """Manual optimization accumulating two micro-batches, the first without communication."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        optimizer, last = self.optimizers(), batch_idx % 2 == 1
        loss = self.step(batch) / 2
        with contextlib.nullcontext() if last else self.trainer.model.no_sync():  # torch DDP's API
            self.manual_backward(loss)
        if last:
            optimizer.step()
            optimizer.zero_grad()
        return loss


class _Features(Dataset):
    """64 fixed random feature vectors, yielded bare: DemoModel wants a tensor batch, not a tuple."""

    def __init__(self) -> None:
        self.data = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


def token_data(n: int = 64) -> TensorDataset:
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=torch.Generator().manual_seed(2))
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


class ReducerProbe(pl.Callback):
    """Records, while fitting, which wrapper Lightning trains through and the reducer's telemetry."""

    def __init__(self) -> None:
        self.model_type = ""
        self.summary: dict[str, Any] = {}

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.model_type = type(trainer.strategy.model).__name__
        if isinstance(trainer.strategy.model, ReducedModule):
            self.summary = {k: trainer.strategy.reducer_summary()[k] for k in ("synced_steps", "buckets", "comm_hook")}


def rank_diff(module: torch.nn.Module) -> float:
    """Largest difference of any parameter from rank 0's copy (0.0: bit-identical ranks)."""
    worst = 0.0
    for param in module.parameters():
        gathered = [torch.empty_like(param) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, param.detach().contiguous())
        worst = max(worst, max(float((g - gathered[0]).abs().max()) for g in gathered))
    return worst


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


MODULES: dict[str, tuple[type[pl.LightningModule], Any]] = {
    "demo": (DemoModel, _Features), "features": (EvaluatedDemoModel, _Features),
    "manual": (ManualOptimBoringModel, _Features), "manual-accumulate": (ManualAccumulation, _Features),
    "transformer": (TokenTransformer, token_data),
}


def fit_lightning(case: str, strategy: Any, out_dir: Path, **trainer_kwargs: Any) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model, data = MODULES[case]
    module, loader = model(), DataLoader(data(), batch_size=4, shuffle=True)
    probe = ReducerProbe()
    callbacks: list[pl.Callback] = [probe]
    tag = "ddp" if strategy == "ddp" else "ours"
    checkpoint = ModelCheckpoint(dirpath=out_dir / f"{case}-{tag}", monitor="val_loss", save_last=True)
    if case == "features":
        callbacks.append(checkpoint)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False,
                         enable_checkpointing=case == "features", enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks, **trainer_kwargs)
    val_loader = DataLoader(data(), batch_size=4) if case == "features" else None
    trainer.fit(module, loader, val_loader)
    result = {"weights": weights(module), "rank_diff": rank_diff(module), "global_step": trainer.global_step,
              "model_type": probe.model_type, "reducer": probe.summary,
              "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}}
    if case == "features":
        tested = trainer.test(module, val_loader, verbose=False)
        result.update(test_loss=float(tested[0]["test_loss"]), best=checkpoint.best_model_path,
                      last=checkpoint.last_model_path)
    return result


PARITY_CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (module, trainer kwargs, our strategy's kwargs)
    "demo": ("demo", {}, {}),
    "demo-accumulate": ("demo", {"accumulate_grad_batches": 2}, {}),
    "transformer": ("transformer", {}, {"bucket_cap_mb": 0.5, "first_bucket_cap_mb": 0.1}),
    "transformer-accumulate": ("transformer", {"accumulate_grad_batches": 2}, {"bucket_cap_mb": 0.5}),
    "manual": ("manual", {}, {}),
    "manual-accumulate": ("manual-accumulate", {}, {}),
    "features-bf16": ("features", {"accumulate_grad_batches": 2, "precision": "bf16-mixed"}, {}),
}


def run_parity(out_dir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, (case, trainer_kwargs, ours_kwargs) in PARITY_CASES.items():
        ours: Any = LightningDDPStrategy(**ours_kwargs) if ours_kwargs else "bucket_ddp"
        results[name] = {"ddp": fit_lightning(case, "ddp", out_dir, **trainer_kwargs),
                         "ours": fit_lightning(case, ours, out_dir, **trainer_kwargs)}
    results["demo-bf16-hook"] = {"ddp": results["demo"]["ddp"],
                                 "ours": fit_lightning("demo", LightningDDPStrategy(comm_hook="bf16"), out_dir)}
    return results


class BatchNormRegressor(pl.LightningModule):
    """Validation depends on the BatchNorm running statistics, which differ by rank (each sees other data)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
        self.val_losses: list[float] = []  # this rank's own values: whose running statistics it used

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.val_losses.append(float(loss))
        self.log("val_loss", loss, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ValidationRecorder(pl.Callback):
    """The synced `val_loss` after every validation run, the sanity check included."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.values.append(float(trainer.callback_metrics.get("val_loss", float("nan"))))


def shifted_data(seed: int, n: int = 64) -> TensorDataset:
    """Inputs far from zero mean, so the running statistics move a lot in a few steps."""
    generator = torch.Generator().manual_seed(seed)
    x = 2.0 + 3.0 * torch.randn(n, 8, generator=generator)
    return TensorDataset(x, x[:, :1] - x[:, 1:2] ** 2 / 10)


def all_ranks(value: Any) -> list[Any]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def fit_batchnorm(strategy: Any, **trainer_kwargs: Any) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    module, recorder = BatchNormRegressor(), ValidationRecorder()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=2, val_check_interval=0.5,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[recorder], **trainer_kwargs)
    trainer.fit(module, DataLoader(shifted_data(4), batch_size=4, shuffle=True),
                DataLoader(shifted_data(5, n=32), batch_size=4))
    return {"val_loss": recorder.values, "rank_val_losses": all_ranks(module.val_losses),
            "rank_weights": all_ranks(weights(module)), "global_step": trainer.global_step}


BUFFER_CASES: dict[str, dict[str, Any]] = {"batchnorm": {}, "batchnorm-accumulate": {"accumulate_grad_batches": 2}}


def run_buffers() -> dict[str, Any]:
    return {name: {"ddp": fit_batchnorm("ddp", **kwargs), "ours": fit_batchnorm("bucket_ddp", **kwargs)}
            for name, kwargs in BUFFER_CASES.items()}


def fit_ours(module: Any, loader: DataLoader | None = None, **trainer_kwargs: Any) -> dict[str, Any]:
    from tests.helpers.rank_checks import RankAgreement
    from trainer import Trainer

    agreement = RankAgreement()
    initial = weights(module)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[agreement], **{"limit_train_batches": 4, "limit_val_batches": 2, **trainer_kwargs})
    trainer.fit(module, loader)
    change = max(float((initial[k] - v).abs().max()) for k, v in weights(module).items())
    return {"rank_diff": agreement.max_rank_diff, "world_size": agreement.world_size, "change": change,
            "global_step": trainer.global_step, "logged": sorted(trainer.logged_metrics), "weights": weights(module)}


def run_ours() -> dict[str, Any]:
    torch.manual_seed(0)
    results = {"boring": fit_ours(BoringModel()), "manual": fit_ours(ManualOptimBoringModel()),
               "transformer": fit_ours(TokenTransformer())}
    # As in fit_lightning, so "demo" compares with Lightning's DDP. shuffle=True because Lightning
    # shuffles every distributed training loader, while our Trainer keeps the loader's setting.
    pl.seed_everything(0, verbose=False)
    results["demo"] = fit_ours(DemoModel(), DataLoader(_Features(), batch_size=4, shuffle=True),
                               limit_train_batches=1.0)
    return results


def main(mode: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    # One process group for all cases, owned here, so no Trainer destroys it between fits: our
    # DDPStrategy re-creating the default group on torchrun's store can hang on the second fit.
    dist.init_process_group("gloo")
    runs = {"parity": lambda: run_parity(out), "ours": run_ours, "buffers": run_buffers}
    results = runs[mode]()
    if dist.get_rank() == 0:
        torch.save(results, out / f"{mode}.pt")
    dist.barrier()
    dist.destroy_process_group()  # left open, gloo can abort the process at exit


if __name__ == "__main__":
    main(*sys.argv[1:3])
