"""An ordinary PyTorch Lightning project trained with our DDP reducer.

The only change from plain Lightning is the `strategy=` argument (and the import that provides
it); everything else is untouched Lightning code. Run it with

    python examples/lightning_project.py

Lightning's launcher starts the second process itself (it re-runs this script), exactly as with
`strategy="ddp"`. The string `strategy="bucket_ddp"` works too once `strategies.lightning` is imported.
"""

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.lightning import LightningDDPStrategy  # the one addition


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = (self.net(x).argmax(dim=1) == y).float().mean()
        self.log("val_acc", accuracy, sync_dist=True, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def make_data(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=generator)
    y = (x[:, :4].argmax(dim=1))  # a learnable rule: which of the first four features is largest
    return TensorDataset(x, y)


def main() -> None:
    pl.seed_everything(0)
    train = DataLoader(make_data(1024, seed=1), batch_size=32, shuffle=True)
    val = DataLoader(make_data(256, seed=2), batch_size=64)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=LightningDDPStrategy(bucket_cap_mb=25, comm_hook=None),  # was: strategy="ddp"
        max_epochs=3,
        accumulate_grad_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(Classifier(), train, val)
    if trainer.is_global_zero:
        print(f"val_acc={trainer.callback_metrics['val_acc']:.3f}")


if __name__ == "__main__":
    main()
