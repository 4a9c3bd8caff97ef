"""Logger: where metrics and hyperparameters go. Only global rank 0 writes."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any


class Logger(abc.ABC):
    """The Trainer calls these on global rank 0 only (see `Trainer._log_metrics`)."""

    @property
    @abc.abstractmethod
    def name(self) -> str: ...

    @property
    @abc.abstractmethod
    def version(self) -> int | str: ...

    @property
    def root_dir(self) -> str | None:
        return None

    @property
    def log_dir(self) -> str | None:
        """Directory this run writes to; `ModelCheckpoint` puts checkpoints under it."""
        return None

    @abc.abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    @abc.abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any]) -> None: ...

    def save(self) -> None:
        """Flush what is buffered."""

    def finalize(self, status: str) -> None:
        """Close files at the end of fit/test ("success" | "failed" | "interrupted")."""
        self.save()
