"""Logger: where metrics and hyperparameters go. Only global rank 0 writes."""

from __future__ import annotations

import abc
import argparse
import os
from collections.abc import Mapping
from typing import Any

import torch

from trainer.hparams import omegaconf_to_builtin


class Logger(abc.ABC):
    """The Trainer calls these on global rank 0 only (trainer/loops/metric_writes.py)."""

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
    def save_dir(self) -> str | None:
        """Where the logger saves (Lightning's logger API; None for a logger that writes no files)."""
        return None

    @property
    def log_dir(self) -> str | None:
        """Directory this run writes to; `ModelCheckpoint` puts checkpoints under it."""
        return None

    @abc.abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    @abc.abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any]) -> None: ...

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called by checkpoint callbacks after each save (Lightning's logger API); a logger that
        uploads checkpoints overrides it."""

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Lightning's logger API: record the model graph; nothing to do for file loggers."""

    def save(self) -> None:
        """Flush what is buffered."""

    def finalize(self, status: str) -> None:
        """Close files at the end of fit/test ("success" | "failed" | "interrupted")."""
        self.save()


class FileLogger(Logger):
    """A logger writing under `<save_dir>/<name>/version_N`: the layout both file loggers share.

    The version is resolved once and cached; the Trainer reads it in the launching process
    before workers start, so every rank agrees on the directory."""

    def __init__(self, save_dir: str | os.PathLike[str], name: str | None, version: int | str | None,
                 prefix: str = "") -> None:
        self._save_dir, self._name, self._version = os.fspath(save_dir), name or "", version
        self._prefix = prefix
        self.hparams: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = next_version(self.root_dir)
        return self._version

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def root_dir(self) -> str:
        return os.path.join(self._save_dir, self._name)

    @property
    def log_dir(self) -> str:
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.expandvars(os.path.expanduser(os.path.join(self.root_dir, version)))


HPARAMS_FILE = "hparams.yaml"


def next_version(root_dir: str) -> int:
    """The next free `version_N` under `root_dir` (0 when there is none), like Lightning."""
    try:
        names = os.listdir(root_dir)
    except OSError:
        return 0
    numbers = [name[len("version_"):] for name in names
               if name.startswith("version_") and os.path.isdir(os.path.join(root_dir, name))]
    versions = [int(number) for number in numbers if number.isdigit()]
    return max(versions) + 1 if versions else 0


def plain_params(value: Any) -> Any:
    """Hyperparameters as YAML-safe builtins: OmegaConf/Namespace/mappings become dicts, one-element
    tensors numbers, anything else its `str`, so logging hyperparameters never fails."""
    value = omegaconf_to_builtin(value)
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, Mapping):
        return {str(key): plain_params(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_params(item) for item in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def save_hparams_yaml(path: str, hparams: Mapping[str, Any]) -> None:
    import yaml  # here, not at the top: only a logger that saves hyperparameters needs it

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(dict(hparams), handle, sort_keys=False)


def scalar(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


def is_logger(obj: Any) -> bool:
    """Ours or any Lightning `Logger` (anything with Lightning's logger interface)."""
    return isinstance(obj, Logger) or all(callable(getattr(obj, name, None))
                                          for name in ("log_metrics", "log_hyperparams", "finalize"))


class _DummyExperiment:
    """Any attribute is a do-nothing call, so `self.logger.experiment.add_image(...)` runs."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class DummyLogger(Logger):
    """What `fast_dev_run` logs to (as in Lightning): it accepts everything and writes nothing, so
    code that touches `self.logger` still runs."""

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    @property
    def experiment(self) -> _DummyExperiment:
        return _DummyExperiment()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        pass
