"""Loggers with Lightning's names, arguments and meanings; only global rank 0 writes."""

from trainer.loggers.base import Logger
from trainer.loggers.csv import CSVLogger
from trainer.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]
