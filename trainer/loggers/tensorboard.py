"""TensorBoardLogger: event files and hparams.yaml in `<save_dir>/<name>/version_N[/sub_dir]`.

As Lightning's: `save()` (at every stage's start and at a successful end) writes `hparams.yaml` once
the folder exists, holding whatever hyperparameters were logged, so a module without any still gets
an empty one; `finalize` closes the writer, and only a later write opens a new event file.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from typing_extensions import override

from strategies.rank_zero import current_global_rank, rank_zero_only
from trainer.loggers.base import HPARAMS_FILE, FileLogger, plain_params, save_hparams_yaml, scalar


class _NoOpWriter:
    """What `.experiment` is on ranks other than 0: every call is accepted and writes nothing, so
    user code such as `self.logger.experiment.add_histogram(...)` runs unchanged on every rank."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"optim": {"lr": 0.1}}` -> `{"optim/lr": 0.1}`: TensorBoard's hparams plugin is flat."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, name))
        else:
            flat[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return flat


class TensorBoardLogger(FileLogger):
    """Lightning's TensorBoard logger. The `SummaryWriter` is created on first write, so ranks
    other than 0 (which never write) create no files, and it is never pickled: a spawned worker
    gets a fresh, lazy one. Extra keyword arguments go to `SummaryWriter`."""

    LOGGER_JOIN_CHAR = "-"
    NAME_HPARAMS_FILE = HPARAMS_FILE

    def __init__(self, save_dir: str | os.PathLike[str], name: str | None = "lightning_logs",
                 version: int | str | None = None, log_graph: bool = False, default_hp_metric: bool = True,
                 prefix: str = "", sub_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        super().__init__(save_dir, name, version, prefix)
        self._log_graph, self._default_hp_metric = log_graph, default_hp_metric
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._kwargs = kwargs
        self._experiment: Any = None

    @property
    def sub_dir(self) -> str | None:
        return self._sub_dir

    @property
    @override
    def log_dir(self) -> str:
        log_dir = super().log_dir
        return log_dir if self._sub_dir is None else os.path.join(log_dir, os.path.expanduser(self._sub_dir))

    @property
    def experiment(self) -> Any:
        """The `torch.utils.tensorboard.SummaryWriter` (a no-op stand-in on ranks other than 0)."""
        if self._experiment is None:
            if current_global_rank() != 0:
                return _NoOpWriter()
            from torch.utils.tensorboard import SummaryWriter  # slow import: only where it writes

            os.makedirs(self.log_dir, exist_ok=True)
            self._experiment = SummaryWriter(log_dir=self.log_dir, **self._kwargs)
        return self._experiment

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        prefix = self._prefix + self.LOGGER_JOIN_CHAR if self._prefix else ""
        for key, value in metrics.items():
            if isinstance(value, Mapping):
                self.experiment.add_scalars(prefix + key, {k: scalar(v) for k, v in value.items()}, step)
                continue
            value = scalar(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                shown = f"a tensor of shape {tuple(value.shape)}" if hasattr(value, "shape") else repr(value)
                raise TypeError(f"TensorBoardLogger.log_metrics got {prefix + key!r}={shown} "
                                f"({type(value).__name__}); expected a number or a one-element tensor. "
                                "Log images or histograms through `logger.experiment`.")
            self.experiment.add_scalar(prefix + key, value, step)

    @override
    @rank_zero_only
    def log_hyperparams(self, params: Any, metrics: Any = None, step: int | None = None) -> None:
        """Write hparams.yaml (nested, like Lightning) and TensorBoard's hparams summary (flat);
        `hp_metric` starts at -1 unless `default_hp_metric=False`. The metrics are logged at `step`,
        None unless given (as Lightning's logger does; TensorBoard files it under step 0)."""
        params = plain_params(params) or {}
        self.hparams.update(params)
        save_hparams_yaml(os.path.join(self.log_dir, self.NAME_HPARAMS_FILE), self.hparams)
        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else {}
        elif not isinstance(metrics, Mapping):
            metrics = {"hp_metric": metrics}
        if metrics:
            from torch.utils.tensorboard.summary import hparams

            self.log_metrics(metrics, step)
            writer = self.experiment._get_file_writer()  # reopens a writer finalize closed
            for summary in hparams(flatten_params(params), {k: scalar(v) for k, v in metrics.items()}):
                writer.add_summary(summary, step)

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        if not self._log_graph:
            return
        input_array = getattr(model, "example_input_array", None) if input_array is None else input_array
        if input_array is None:
            warnings.warn("TensorBoardLogger(log_graph=True) could not log the graph: pass `input_array` "
                          "or set `model.example_input_array`.")
            return
        self.experiment.add_graph(model, input_array)

    @override
    @rank_zero_only
    def save(self) -> None:
        if self._experiment is not None:
            self._experiment.flush()
        hparams_file = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        if os.path.isdir(self.log_dir) and not os.path.isfile(hparams_file):
            save_hparams_yaml(hparams_file, self.hparams)

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._experiment is not None:
            # closed but kept: the SummaryWriter opens a new event file only if something is written
            # later (test after fit), as Lightning's does; a stage that writes nothing leaves none.
            # Flushed first, as Lightning does: a writer that buffers apart from close() still gets its events out.
            self._experiment.flush()
            self._experiment.close()
        if status == "success":
            self.save()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_experiment"] = None
        return state
