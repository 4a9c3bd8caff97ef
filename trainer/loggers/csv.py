"""CSVLogger: metrics to `<save_dir>/<name>/version_N/metrics.csv`, hyperparameters to hparams.yaml."""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from typing import Any

from typing_extensions import override

from strategies.rank_zero import current_global_rank, rank_zero_only
from trainer.loggers.base import HPARAMS_FILE, FileLogger, plain_params, save_hparams_yaml, scalar


class CSVLogger(FileLogger):
    """A dependency-free logger: one row per `log_metrics` call with a "step" column; the header
    is the sorted union of all keys seen, and the file is rewritten when a new key arrives."""

    LOGGER_JOIN_CHAR = "-"
    NAME_METRICS_FILE = "metrics.csv"

    def __init__(self, save_dir: str | os.PathLike[str], name: str | None = "lightning_logs",
                 version: int | str | None = None, prefix: str = "", flush_logs_every_n_steps: int = 100) -> None:
        if isinstance(flush_logs_every_n_steps, bool) or not isinstance(flush_logs_every_n_steps, int) \
                or flush_logs_every_n_steps < 1:
            raise ValueError(f"CSVLogger(flush_logs_every_n_steps={flush_logs_every_n_steps!r}) must be an int >= 1.")
        super().__init__(save_dir, name, version, prefix)
        self._flush_every = flush_logs_every_n_steps
        self._rows: list[dict[str, Any]] = []  # buffered until the next flush
        self._keys: list[str] = []
        self._started = False  # a previous run's metrics.csv in this directory is replaced, like Lightning
        self._dir_made = False

    @property
    def metrics_file_path(self) -> str:
        return os.path.join(self.log_dir, self.NAME_METRICS_FILE)

    @property
    def experiment(self) -> CSVLogger:
        """The writer of `metrics.csv`: this logger itself (`log_metrics`, `save`, `metrics_file_path`), its
        directory made on first use, as Lightning's CSVLogger makes its writer's."""
        if not self._dir_made and current_global_rank() == 0:
            os.makedirs(self.log_dir, exist_ok=True)
            self._dir_made = True
        return self

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
