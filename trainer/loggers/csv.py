"""CSVLogger: metrics to `<save_dir>/<name>/version_N/metrics.csv`, hyperparameters to hparams.yaml.

Also home of the helpers both file loggers share (version numbering, plain hparams, YAML).
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Mapping
from typing import Any

import torch
import yaml
from omegaconf import Container, OmegaConf
from typing_extensions import override

from strategies.rank_zero import rank_zero_only
from trainer.loggers.base import Logger

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
    if isinstance(value, Container):
        value = OmegaConf.to_container(value, resolve=True)
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
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(dict(hparams), handle, sort_keys=False)


def scalar(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


class CSVLogger(Logger):
    """A dependency-free logger: one row per `log_metrics` call with a "step" column; the header
    is the sorted union of all keys seen, and the file is rewritten when a new key arrives."""

    LOGGER_JOIN_CHAR = "-"
    NAME_METRICS_FILE = "metrics.csv"

    def __init__(self, save_dir: str | os.PathLike[str], name: str | None = "lightning_logs",
                 version: int | str | None = None, prefix: str = "", flush_logs_every_n_steps: int = 100) -> None:
        if isinstance(flush_logs_every_n_steps, bool) or not isinstance(flush_logs_every_n_steps, int) \
                or flush_logs_every_n_steps < 1:
            raise ValueError(f"CSVLogger(flush_logs_every_n_steps={flush_logs_every_n_steps!r}) must be an int >= 1.")
        self._save_dir, self._name, self._version = os.fspath(save_dir), name or "", version
        self._prefix, self._flush_every = prefix, flush_logs_every_n_steps
        self.hparams: dict[str, Any] = {}
        self._rows: list[dict[str, Any]] = []  # buffered until the next flush
        self._keys: list[str] = []
        self._started = False  # a previous run's metrics.csv in this directory is replaced, like Lightning

    @property
    @override
    def name(self) -> str:
        return self._name

    @property
    @override
    def version(self) -> int | str:
        if self._version is None:  # resolved once, then cached: every rank must agree on it
            self._version = next_version(self.root_dir)
        return self._version

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    @override
    def root_dir(self) -> str:
        return os.path.join(self._save_dir, self._name)

    @property
    @override
    def log_dir(self) -> str:
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.expandvars(os.path.expanduser(os.path.join(self.root_dir, version)))

    @property
    def metrics_file_path(self) -> str:
        return os.path.join(self.log_dir, self.NAME_METRICS_FILE)

    @override
    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        self.hparams.update(plain_params(params) or {})
        save_hparams_yaml(os.path.join(self.log_dir, HPARAMS_FILE), self.hparams)

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        prefix = self._prefix + self.LOGGER_JOIN_CHAR if self._prefix else ""
        row = {prefix + key: scalar(value) for key, value in metrics.items()}
        row["step"] = len(self._rows) if step is None else step
        self._rows.append(row)
        if (row["step"] + 1) % self._flush_every == 0:
            self.save()

    @override
    @rank_zero_only
    def save(self) -> None:
        if not self._rows:
            return
        os.makedirs(self.log_dir, exist_ok=True)
        new_keys = set().union(*self._rows) - set(self._keys)
        if new_keys:
            self._keys = sorted({*self._keys, *new_keys})
            if self._started:
                self._rewrite_with_header()
        with open(self.metrics_file_path, "a" if self._started else "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=self._keys)
            if not self._started:
                writer.writeheader()
            writer.writerows(self._rows)
        self._rows, self._started = [], True

    def _rewrite_with_header(self) -> None:
        with open(self.metrics_file_path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        with open(self.metrics_file_path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=self._keys)
            writer.writeheader()
            writer.writerows(rows)
