"""The corpus: Lightning modules written the way real projects write them, and how each is run.

Every module below is an ordinary `pytorch_lightning.LightningModule` (two are also built on
`lightning.pytorch`), untouched by the harness: `Recorded<Name>` is a recording subclass made by
`recording.recorded`, bound here at module level so it pickles into worker processes. The data
is generated in code from fixed generators (no downloads). Evaluation sets have sizes divisible
by 2, so at 2 processes Lightning's padded `DistributedSampler` and our exactly-once shards hand
every rank the same samples (see `compare.DELIBERATE_DIFFERENCES["exactly_once_eval"]`).

How each module is run (Trainer arguments, callbacks, stages) is in `cases.py`.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as L
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchmetrics import MaxMetric, MeanMetric, MeanSquaredError
from torchmetrics.classification import Accuracy

from tests.conformance.recording import recorded

FEATURES, CLASSES, REG_FEATURES = 16, 3, 8


# ---------------------------------------------------------------------- data
def classification(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(100))
    x = torch.randn(n, FEATURES, generator=generator)
    y = (x @ weights + 0.5 * torch.randn(n, CLASSES, generator=generator)).argmax(1)
    return TensorDataset(x, y)


def regression(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(REG_FEATURES, 1, generator=torch.Generator().manual_seed(101))
    x = torch.randn(n, REG_FEATURES, generator=generator)
    return TensorDataset(x, x @ weights + 0.1 * torch.randn(n, 1, generator=generator))


class DictDataset(Dataset):
    """Yields {"x": ..., "y": ...} dicts, as datasets of real projects often do."""

    def __init__(self, n: int, seed: int) -> None:
        self.inner = regression(n, seed)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x, y = self.inner[index]
        return {"x": x, "y": y}


class TransformedRegression(Dataset):
    """`regression(n, seed)` rows whose features pass through `transform` at every fetch (in the worker)."""

    def __init__(self, n: int, seed: int) -> None:
        self.inner = regression(n, seed)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.inner[index]
        return self.transform(x), y

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class RankShiftedDataset(TransformedRegression):
    """Features that depend on the rank reading them: rank r sees `x * (1 + r) + 3 r`, so rank 0's
    batches have mean about 0 and std about 1, rank 1's mean about 3 and std about 2. Each rank's
    BatchNorm running statistics then drift far apart during training, and which rank's statistics an
    evaluation forward uses changes its loss by far more than any tolerance."""

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        return x * (1 + rank) + 3.0 * rank


class RankShiftedData(pl.LightningDataModule):
    """A shuffled training loader (both Trainers' injected samplers shuffle the training shards,
    seed them with PL_GLOBAL_SEED and set_epoch them, so every rank gets the same batches under both) and an unshuffled validation set of 32 = 2 ranks x 2
    batches x 8, which Lightning's padded sampler and our exactly-once shards split alike."""

    def __init__(self, batch_size: int = 8, train: int = 96, val: int = 32) -> None:
        super().__init__()
        self.batch_size, self.sizes = batch_size, (train, val)

    def setup(self, stage: str) -> None:
        self.sets = [RankShiftedDataset(n, seed) for n, seed in zip(self.sizes, (1, 2))]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[0], batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[1], batch_size=self.batch_size)


def _classification_data(base: type) -> type:
    class ClassificationData(base):  # type: ignore[misc, valid-type]
        """lightning-hydra-template's MNISTDataModule, with generated data."""

        def __init__(self, batch_size: int = 16, train: int = 64, val: int = 32, test: int = 32) -> None:
            super().__init__()
            self.save_hyperparameters(logger=False)
            self.data_train: Any = None
            self.data_val: Any = None
            self.data_test: Any = None
            self.batch_size_per_device = batch_size

        def setup(self, stage: str | None = None) -> None:
            if self.trainer is not None:
                if self.hparams.batch_size % self.trainer.world_size != 0:
                    raise RuntimeError("batch size not divisible by the number of devices")
                self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size
            if not self.data_train and not self.data_val and not self.data_test:
                self.data_train = classification(self.hparams.train, 1)
                self.data_val = classification(self.hparams.val, 2)
                self.data_test = classification(self.hparams.test, 3)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(self.data_train, batch_size=self.batch_size_per_device, shuffle=True)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(self.data_val, batch_size=self.batch_size_per_device, shuffle=False)

        def test_dataloader(self) -> DataLoader:
            return DataLoader(self.data_test, batch_size=self.batch_size_per_device, shuffle=False)

        def teardown(self, stage: str | None = None) -> None:
            pass

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            pass

    return ClassificationData


class RegressionData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 8, train: int = 64, val: int = 32, test: int = 32, predict: int = 16,
                 shuffle: bool = True) -> None:
        super().__init__()
        self.batch_size, self.sizes, self.shuffle = batch_size, (train, val, test, predict), shuffle

    def setup(self, stage: str) -> None:
        self.sets = [regression(n, seed) for n, seed in zip(self.sizes, (1, 2, 3, 4))]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[0], batch_size=self.batch_size, shuffle=self.shuffle)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[1], batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[2], batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[3], batch_size=self.batch_size)


class NoisyDataset(TransformedRegression):
    """A random augmentation, as real datasets have: every fetch draws from torch's global generator,
    so a batch fetched and thrown away changes every later batch and shuffle."""

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.01 * torch.randn_like(x)


class NoisyData(RegressionData):
    def setup(self, stage: str) -> None:
        self.sets = [NoisyDataset(n, seed) for n, seed in zip(self.sizes, (1, 2, 3, 4))]


class TwoLoaderData(RegressionData):
    """Two validation and two test sets (Lightning suffixes their metrics with /dataloader_idx_N)."""

    def val_dataloader(self) -> list[DataLoader]:  # type: ignore[override]
        return [DataLoader(self.sets[1], batch_size=8), DataLoader(regression(24, 5), batch_size=8)]

    def test_dataloader(self) -> list[DataLoader]:  # type: ignore[override]
        return [DataLoader(self.sets[2], batch_size=8), DataLoader(regression(16, 6), batch_size=8)]


class DictData(RegressionData):
    def setup(self, stage: str) -> None:
        self.sets = [DictDataset(n, seed) for n, seed in zip(self.sizes, (1, 2, 3, 4))]


# ---------------------------------------------------------------------- modules
def _template_module(base: type) -> type:
    class TemplateModule(base):  # type: ignore[misc, valid-type]
        """lightning-hydra-template's MNISTLitModule: torchmetrics objects logged and computed in
        on_validation_epoch_end, a MaxMetric "best", `self.trainer.model.parameters()` and
        ReduceLROnPlateau on a validation metric."""

        def __init__(self, hidden: int = 32, lr: float = 0.01) -> None:
            super().__init__()
            self.save_hyperparameters(logger=False)
            self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))
            self.criterion = nn.CrossEntropyLoss()
            self.train_acc = Accuracy(task="multiclass", num_classes=CLASSES)
            self.val_acc = Accuracy(task="multiclass", num_classes=CLASSES)
            self.test_acc = Accuracy(task="multiclass", num_classes=CLASSES)
            self.train_loss, self.val_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()
            self.val_acc_best = MaxMetric()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def on_train_start(self) -> None:
            self.val_loss.reset()
            self.val_acc.reset()
            self.val_acc_best.reset()

        def model_step(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x, y = batch
            logits = self.forward(x)
            return self.criterion(logits, y), logits.argmax(dim=1), y

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss, preds, targets = self.model_step(batch)
            self.train_loss(loss)
            self.train_acc(preds, targets)
            self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
            self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            loss, preds, targets = self.model_step(batch)
            self.val_loss(loss)
            self.val_acc(preds, targets)
            self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
            self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

        def on_validation_epoch_end(self) -> None:
            acc = self.val_acc.compute()
            self.val_acc_best(acc)
            self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

        def test_step(self, batch: Any, batch_idx: int) -> None:
            loss, preds, targets = self.model_step(batch)
            self.test_loss(loss)
            self.test_acc(preds, targets)
            self.log("test/loss", self.test_loss, on_step=False, on_epoch=True, prog_bar=True)
            self.log("test/acc", self.test_acc, on_step=False, on_epoch=True, prog_bar=True)

        def configure_optimizers(self) -> dict[str, Any]:
            optimizer = torch.optim.Adam(params=self.trainer.model.parameters(), lr=self.hparams.lr)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss",
                                                             "interval": "epoch", "frequency": 1}}

    return TemplateModule


def _hooks_module(base: type) -> type:
    class HooksModule(base):  # type: ignore[misc, valid-type]
        """Every stage, with the dataloaders defined on the module itself (BoringModel style)."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(REG_FEATURES, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

        def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
            x, y = batch
            loss = F.mse_loss(self(x), y)
            self.log("train_loss", loss)
            return {"loss": loss, "extra": loss.detach() * 2}

        def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
            x, y = batch
            loss = F.mse_loss(self(x), y)
            self.log("val_loss", loss)
            return {"x": loss}

        def test_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("test_loss", F.mse_loss(self(x), y))

        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self(batch[0])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.layer.parameters(), lr=0.1)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(regression(64, 1), batch_size=8)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(regression(32, 2), batch_size=8)

        def test_dataloader(self) -> DataLoader:
            return DataLoader(regression(32, 3), batch_size=8)

        def predict_dataloader(self) -> DataLoader:
            return DataLoader(regression(16, 4), batch_size=8)

    return HooksModule


class Regressor(pl.LightningModule):
    """A small MLP regressor; the cases below subclass it as projects subclass their base module."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(REG_FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class BatchNormModule(pl.LightningModule):
    """Linear -> BatchNorm1d -> ReLU -> Linear. Under DDP its running statistics are buffers that
    torch DDP broadcasts from rank 0 before a forward when the previous forward ran with grad
    enabled outside no_sync (and before the first): so each validation run after training steps
    normalises with rank 0's statistics on every rank, while training steps after a validation
    keep each rank's own. `val_loss` is synced across ranks, so it shows which statistics rank 1
    used."""

    def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(REG_FEATURES, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class LoggingModule(Regressor):
    """`self.log` / `log_dict` in their many forms: reduce_fx, on_step/on_epoch, prog_bar,
    logger=False, batch_size, sync_dist, a torchmetrics object, logging from hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.mse = MeanSquaredError()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        pred = self(x)
        loss = F.mse_loss(pred, y)
        self.mse(pred, y)
        self.log("loss", loss, prog_bar=True)
        self.log("both", loss, on_step=True, on_epoch=True)
        self.log("r_sum", loss, on_epoch=True, reduce_fx="sum")
        self.log("r_max", loss, on_epoch=True, reduce_fx="max")
        self.log("r_min", loss, on_epoch=True, reduce_fx=torch.min)
        self.log("r_tsum", loss, on_step=False, on_epoch=True, reduce_fx=torch.sum)
        self.log("r_mean", loss, on_step=False, on_epoch=True, reduce_fx=torch.mean)
        self.log_dict({"d/a": loss * 2, "d/b": float(batch_idx)}, on_step=True, on_epoch=True, prog_bar=True)
        self.log("hidden", loss, logger=False, prog_bar=True)
        self.log("weighted", x.mean(), on_step=False, on_epoch=True, batch_size=x.shape[0])
        self.log("synced", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("synced_max", loss, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="max")
        self.log("train/mse", self.mse, on_step=True, on_epoch=True)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.log("hook/batch_end", float(batch_idx))

    def on_train_epoch_end(self) -> None:
        self.log("hook/epoch_end", float(self.current_epoch))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log_dict({"val/loss": loss, "val/err": (self(x) - y).abs().mean()}, prog_bar=True, sync_dist=True)
        self.log("val/max", loss, reduce_fx="max", sync_dist=True)
        self.log("val/steps", loss, on_step=True, on_epoch=True)

    def on_validation_epoch_end(self) -> None:
        # A value that changes from epoch to epoch without reading the loop's counters: at 2 processes
        # the oracle's spawned workers restart those at 0 for validate() (compare.ORACLE_LIMITATIONS).
        self.log("val/epoch_hook", float(next(self.parameters()).detach().sum()) + 0.5)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test/sum", F.mse_loss(self(x), y), reduce_fx="sum", sync_dist=True)


class TwoLoadersModule(Regressor):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("val_loss", loss)
        self.log(f"val_loss_of_{dataloader_idx}", loss, add_dataloader_idx=False)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y))


class ManualGAN(pl.LightningModule):
    """Manual optimization with two optimizers and two schedulers stepped per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, REG_FEATURES))
        self.discriminator = nn.Sequential(nn.Linear(REG_FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, _ = batch
        opt_g, opt_d = self.optimizers()
        noise = torch.randn(real.shape[0], 4, generator=torch.Generator().manual_seed(batch_idx))
        self.toggle_optimizer(opt_d)
        fake = self.generator(noise).detach()
        d_loss = F.softplus(-self.discriminator(real)).mean() + F.softplus(self.discriminator(fake)).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        self.clip_gradients(opt_d, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.toggle_optimizer(opt_g)
        g_loss = F.softplus(-self.discriminator(self.generator(noise))).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

    def on_train_epoch_end(self) -> None:
        sch_g, sch_d = self.lr_schedulers()
        sch_g.step()
        sch_d.step()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        real, _ = batch
        self.log("val_d_real", torch.sigmoid(self.discriminator(real)).mean())

    def configure_optimizers(self) -> Any:
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=0.01)
        opt_d = torch.optim.SGD(self.discriminator.parameters(), lr=0.05, momentum=0.9)
        return [opt_g, opt_d], [torch.optim.lr_scheduler.StepLR(opt_g, 1, 0.5),
                                torch.optim.lr_scheduler.ExponentialLR(opt_d, 0.9)]


class SchedulerModule(Regressor):
    """Every `configure_optimizers` return form with a scheduler, chosen by `form`."""

    def __init__(self, form: str) -> None:
        super().__init__(lr=0.1)
        self.form = form

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.5)
        sched = torch.optim.lr_scheduler
        if self.form == "lists":
            return [opt], [sched.StepLR(opt, step_size=1, gamma=0.5)]
        if self.form == "dict_step_freq2":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched.StepLR(opt, 1, 0.9), "interval": "step",
                                                       "frequency": 2}}
        if self.form == "onecycle":
            total = int(self.trainer.estimated_stepping_batches)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched.OneCycleLR(opt, 0.2, total_steps=total),
                                                       "interval": "step"}}
        if self.form == "epoch_freq2":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched.ExponentialLR(opt, 0.5), "interval": "epoch",
                                                       "frequency": 2}}
        if self.form == "plateau_val":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched.ReduceLROnPlateau(opt, "max", 0.5, 0),
                                                       "monitor": "val_loss"}}
        if self.form == "plateau_train_step":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched.ReduceLROnPlateau(opt, "max", 0.5, 0),
                                                       "monitor": "train_loss", "interval": "step", "frequency": 3}}
        if self.form == "bare_dict":
            return {"optimizer": opt, "lr_scheduler": sched.MultiStepLR(opt, milestones=[1, 2], gamma=0.3)}
        if self.form == "list_of_dicts":
            return [{"optimizer": opt, "lr_scheduler": {"scheduler": sched.StepLR(opt, 5, 0.5), "interval": "step",
                                                        "name": "my_lr"}}]
        raise ValueError(self.form)


SCHEDULER_FORMS = ("lists", "dict_step_freq2", "onecycle", "epoch_freq2", "plateau_val", "plateau_train_step",
                   "bare_dict", "list_of_dicts")


class HParamsModule(Regressor):
    """save_hyperparameters, extra checkpoint state, and load_from_checkpoint afterwards."""

    def __init__(self, hidden: int = 16, lr: float = 0.05, name: str = "run", betas: tuple = (0.9, 0.99)) -> None:
        super().__init__(lr=lr)
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(REG_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.restored_extra: Any = None

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, betas=self.hparams.betas)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["extra_state"] = {"epoch_seen": self.current_epoch}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.restored_extra = checkpoint.get("extra_state")


class LazyModule(pl.LightningModule):
    """Layers created in configure_model (every stage calls it again: it must be idempotent); no
    validation_step, although the DataModule has a val_dataloader."""

    def __init__(self) -> None:
        super().__init__()
        self.body: nn.Module | None = None

    def configure_model(self) -> None:
        if self.body is not None:
            return
        self.body = nn.Sequential(nn.Linear(REG_FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[misc]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.trainer.model.parameters(), lr=0.05)


class TransferModule(Regressor):
    """The batch-transfer hooks on a dict batch."""

    def _xy(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["x"], batch["y"]

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        batch["x"] = batch["x"] - 0.5
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return {key: value.to(device) for key, value in batch.items()}

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.trainer.training:
            batch["x"] = batch["x"] * 2.0
        return batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(self._xy(batch), batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        super().validation_step(self._xy(batch), batch_idx)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        super().test_step(self._xy(batch), batch_idx)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch["x"])


class ClipModule(Regressor):
    """A large learning rate, so gradient clipping changes the result."""

    def __init__(self) -> None:
        super().__init__(lr=0.5)


class CustomClipModule(ClipModule):
    """configure_gradient_clipping overridden: no clipping in the first epoch."""

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        if self.current_epoch > 0:
            self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                                gradient_clip_algorithm=gradient_clip_algorithm)


class AccumulateModule(Regressor):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.9),
                                                   "interval": "step"}}


class EpochLossModule(Regressor):
    """Logs its training loss per epoch only (an EarlyStopping monitor on a train metric)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_epoch_loss", loss, on_step=False, on_epoch=True)
        return loss


ClassificationData = _classification_data(pl.LightningDataModule)
UnifiedClassificationData = _classification_data(L.LightningDataModule)
TemplateModule = _template_module(pl.LightningModule)
UnifiedTemplateModule = _template_module(L.LightningModule)
HooksModule = _hooks_module(pl.LightningModule)
UnifiedHooksModule = _hooks_module(L.LightningModule)
for _name in ("ClassificationData", "UnifiedClassificationData", "TemplateModule", "UnifiedTemplateModule",
              "HooksModule", "UnifiedHooksModule"):
    globals()[_name].__qualname__ = globals()[_name].__name__ = _name

_BASES = {"pytorch_lightning": (pl.LightningModule, pl.LightningDataModule),
          "lightning.pytorch": (L.LightningModule, L.LightningDataModule)}
for _cls, _package in [(ClassificationData, "pytorch_lightning"), (UnifiedClassificationData, "lightning.pytorch"),
                       (RegressionData, "pytorch_lightning"), (TwoLoaderData, "pytorch_lightning"),
                       (DictData, "pytorch_lightning"), (RankShiftedData, "pytorch_lightning"),
                       (NoisyData, "pytorch_lightning")]:
    _recorded = recorded(_cls, _BASES[_package][1], src="datamodule")
    globals()[_recorded.__name__] = _recorded
for _cls, _package in [(TemplateModule, "pytorch_lightning"), (UnifiedTemplateModule, "lightning.pytorch"),
                       (HooksModule, "pytorch_lightning"), (UnifiedHooksModule, "lightning.pytorch"),
                       (Regressor, "pytorch_lightning"), (LoggingModule, "pytorch_lightning"),
                       (TwoLoadersModule, "pytorch_lightning"), (ManualGAN, "pytorch_lightning"),
                       (SchedulerModule, "pytorch_lightning"), (HParamsModule, "pytorch_lightning"),
                       (LazyModule, "pytorch_lightning"), (TransferModule, "pytorch_lightning"),
                       (ClipModule, "pytorch_lightning"), (CustomClipModule, "pytorch_lightning"),
                       (AccumulateModule, "pytorch_lightning"), (EpochLossModule, "pytorch_lightning"),
                       (BatchNormModule, "pytorch_lightning")]:
    _recorded = recorded(_cls, _BASES[_package][0])
    globals()[_recorded.__name__] = _recorded
