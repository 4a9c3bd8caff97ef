from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainer.loggers import TensorBoardLogger


def _scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_version_is_the_next_free_integer_and_cached(tmp_path: Path) -> None:
    for existing in ("version_0", "version_3", "version_x", "other"):
        (tmp_path / "lightning_logs" / existing).mkdir(parents=True)
    (tmp_path / "lightning_logs" / "version_9").write_text("a file, not a run directory")
    logger = TensorBoardLogger(tmp_path)
    assert logger.version == 4
    (tmp_path / "lightning_logs" / "version_4").mkdir()
    assert logger.version == 4  # cached: workers see the version the parent resolved
    assert logger.log_dir == str(tmp_path / "lightning_logs" / "version_4")
    assert TensorBoardLogger(tmp_path / "fresh").version == 0


def test_string_version_empty_name_and_sub_dir(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="", version="run-a", sub_dir="fit")
    assert logger.log_dir == str(tmp_path / "run-a" / "fit")
    assert TensorBoardLogger(tmp_path, name=None).log_dir == str(tmp_path / "version_0")
    assert logger.root_dir == str(tmp_path) + "/" and logger.name == ""


def test_metrics_are_written_with_their_values_and_steps(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, prefix="fit")
    logger.log_metrics({"loss": torch.tensor(0.5), "acc": 0.25}, step=3)
    logger.log_metrics({"loss": 0.125, "pair": {"a": 1.0, "b": torch.tensor(2.0)}}, step=7)
    logger.finalize("success")
    scalars = _scalars(logger.log_dir)
    assert scalars["fit-loss"] == [(3, 0.5), (7, 0.125)]
    assert scalars["fit-acc"] == [(3, 0.25)]
    with pytest.raises(TypeError, match=r"'fit-image'=a tensor of shape \(2, 2\).*expected a number"):
        logger.log_metrics({"image": torch.zeros(2, 2)}, step=8)


def test_hyperparams_go_to_yaml_and_hp_metric(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path)
    params = OmegaConf.create({"model": {"hidden": 32, "act": "relu"}, "lr": 0.1, "layers": [1, 2]})
    logger.log_hyperparams(params)
    logger.log_hyperparams({"seed": 7, "device": torch.device("cpu")})
    logger.finalize("success")
    saved = yaml.safe_load(Path(logger.log_dir, "hparams.yaml").read_text())
    assert saved == {"model": {"hidden": 32, "act": "relu"}, "lr": 0.1, "layers": [1, 2], "seed": 7, "device": "cpu"}
    assert _scalars(logger.log_dir)["hp_metric"] == [(0, -1.0), (0, -1.0)]

    quiet = TensorBoardLogger(tmp_path / "quiet", default_hp_metric=False)
    quiet.log_hyperparams({"lr": 0.1})
    assert not any(Path(quiet.log_dir).glob("events.*"))  # no writer needed without a metric


def test_nothing_is_created_before_the_first_write(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path / "logs")
    assert (logger.version, logger.name) == (0, "lightning_logs") and logger.log_dir
    logger.save()
    logger.finalize("success")
    assert not (tmp_path / "logs").exists()


def test_ranks_other_than_zero_create_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    logger = TensorBoardLogger(tmp_path)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.log_hyperparams({"lr": 0.1})
    logger.experiment.add_histogram("w", torch.zeros(3), 0)  # user code on every rank keeps working
    logger.finalize("success")
    assert list(tmp_path.iterdir()) == []


def test_pickling_drops_the_writer_and_the_copy_keeps_logging(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path)
    logger.log_metrics({"loss": 1.0}, step=0)
    clone = pickle.loads(pickle.dumps(logger))
    assert clone._experiment is None and logger._experiment is not None
    clone.log_metrics({"loss": 2.0}, step=1)
    clone.finalize("success")
    logger.finalize("success")
    assert clone.log_dir == logger.log_dir
    assert sorted(_scalars(logger.log_dir)["loss"]) == [(0, 1.0), (1, 2.0)]


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
def test_log_graph_uses_the_example_input(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    model.example_input_array = torch.zeros(1, 2)  # type: ignore[assignment]
    TensorBoardLogger(tmp_path / "off").log_graph(model)
    assert not (tmp_path / "off").exists()
    logger = TensorBoardLogger(tmp_path / "on", log_graph=True)
    logger.log_graph(model)
    logger.finalize("success")
    assert any(Path(logger.log_dir).glob("events.*"))


def test_hp_metric_is_logged_at_lightnings_step(tmp_path: Path) -> None:
    """Lightning's TensorBoardLogger logs the default hp_metric with step=None (TensorBoard files
    it under 0), in a fit as when called directly; ours hands log_metrics the same calls."""
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger

    from trainer import Trainer

    def recording(base: type) -> type:
        class Recording(base):  # type: ignore[misc, valid-type]
            def log_metrics(self, metrics: dict, step: int | None = None) -> None:
                self.calls.append((sorted(metrics), step))
                super().log_metrics(metrics, step)

        return Recording

    class WithHparams(BoringModel):
        def __init__(self, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            output = super().training_step(batch, batch_idx)
            self.log("train_loss", output["loss"])
            return output

    calls = {}
    for name, logger_class, trainer_class in (("lightning", LightningTensorBoardLogger, pl.Trainer),
                                              ("ours", TensorBoardLogger, Trainer)):
        logger = recording(logger_class)(tmp_path / name)
        logger.calls = []
        logger.log_hyperparams({"lr": 0.1})
        logger.log_hyperparams({"lr": 0.1}, metrics={"hp_metric": 0.5}, step=3)
        fit_logger = recording(logger_class)(tmp_path / name, name="fit")
        fit_logger.calls = []
        trainer_class(default_root_dir=tmp_path / name, max_epochs=1, limit_train_batches=2, limit_val_batches=0,
                      logger=fit_logger, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, log_every_n_steps=1).fit(WithHparams())
        calls[name] = (logger.calls, fit_logger.calls)
    assert calls["ours"] == calls["lightning"]
    assert calls["ours"][0] == [(["hp_metric"], None), (["hp_metric"], 3)]
    assert calls["ours"][1][:2] == [(["hp_metric"], None), (["epoch", "train_loss"], 0)]
