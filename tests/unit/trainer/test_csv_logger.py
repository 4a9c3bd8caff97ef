from __future__ import annotations

import csv
import pickle
from pathlib import Path

import pytest
import torch
import yaml

from trainer.loggers import CSVLogger
from trainer.loggers.base import next_version, plain_params


def _rows(path: str) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_header_grows_as_new_keys_arrive(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"loss": torch.tensor(0.5), "epoch": 0}, step=0)
    logger.save()
    logger.log_metrics({"loss": 0.25, "val_acc": 0.9, "epoch": 1}, step=1)
    logger.finalize("success")
    header, rows = _rows(logger.metrics_file_path)
    assert header == ["epoch", "loss", "step", "val_acc"]
    assert rows == [{"epoch": "0", "loss": "0.5", "step": "0", "val_acc": ""},
                    {"epoch": "1", "loss": "0.25", "step": "1", "val_acc": "0.9"}]


def test_rows_are_flushed_every_n_steps(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=2)
    logger.log_metrics({"loss": 1.0}, step=0)
    assert not Path(logger.metrics_file_path).exists()
    logger.log_metrics({"loss": 2.0}, step=1)  # (1 + 1) % 2 == 0: flushed
    assert [row["loss"] for row in _rows(logger.metrics_file_path)[1]] == ["1.0", "2.0"]


def test_a_previous_runs_file_in_the_same_version_is_replaced(tmp_path: Path) -> None:
    first = CSVLogger(tmp_path, version="fixed")
    first.log_metrics({"a": 1}, step=0)
    first.save()
    second = CSVLogger(tmp_path, version="fixed", prefix="re")
    second.log_metrics({"b": 2}, step=0)
    second.save()
    assert _rows(second.metrics_file_path) == (["re-b", "step"], [{"re-b": "2", "step": "0"}])


def test_hparams_yaml_and_version_layout(tmp_path: Path) -> None:
    (tmp_path / "logs" / "version_1").mkdir(parents=True)
    logger = CSVLogger(tmp_path, name="logs")
    assert logger.version == 2 and logger.log_dir == str(tmp_path / "logs" / "version_2")
    logger.log_hyperparams({"optim": {"lr": torch.tensor(0.5)}, "name": "mlp"})
    saved = yaml.safe_load(Path(logger.log_dir, "hparams.yaml").read_text())
    assert saved == {"optim": {"lr": 0.5}, "name": "mlp"}
    assert CSVLogger(tmp_path, name="").log_dir == str(tmp_path / "version_0")


def test_ranks_other_than_zero_create_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert list(tmp_path.iterdir()) == []


def test_logger_pickles_for_spawned_workers(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    clone = pickle.loads(pickle.dumps(logger))
    assert clone.version == logger.version == 0


def test_helpers_and_arguments(tmp_path: Path) -> None:
    assert next_version(str(tmp_path / "missing")) == 0
    assert plain_params({"a": (1, None), "b": object}) == {"a": [1, None], "b": "<class 'object'>"}
    with pytest.raises(ValueError, match="flush_logs_every_n_steps=0"):
        CSVLogger(tmp_path, flush_logs_every_n_steps=0)
