"""Callbacks with Lightning's names, arguments and meanings."""

from trainer.callbacks.base import Callback
from trainer.callbacks.divergence import DivergenceError, DivergenceGuard
from trainer.callbacks.early_stopping import EarlyStopping
from trainer.callbacks.lr_monitor import LearningRateMonitor
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.callbacks.model_summary import ModelSummary
from trainer.callbacks.prediction_writer import BasePredictionWriter
from trainer.callbacks.progress import TQDMProgressBar
from trainer.callbacks.telemetry import TelemetryMonitor

__all__ = ["BasePredictionWriter", "Callback", "DivergenceError", "DivergenceGuard", "EarlyStopping", "LearningRateMonitor", "ModelCheckpoint", "ModelSummary",
           "TQDMProgressBar", "TelemetryMonitor"]
