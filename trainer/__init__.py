"""ddp-trainer: a Lightning-style Trainer with its own, inspectable DDP strategy.

Importing this package never imports Lightning (start-up time); see strategies.lightning
for the plug-in into pytorch_lightning.Trainer.
"""

from trainer.datamodule import LightningDataModule
from trainer.module import LightningModule
from trainer.seed import seed_everything
from trainer.trainer import Trainer

__all__ = ["LightningDataModule", "LightningModule", "Trainer", "seed_everything"]
