"""A LightningCLI program as Lightning's examples write them, run unchanged under Lightning's CLI and ours.

    python -m tests.conformance.lightning_cli_program {lightning|ours} {cli|subclass|no_run} <CLI arguments>

`$CLI_PACKAGE` is the Lightning package the program is written against (`pytorch_lightning`, the default, or
`lightning.pytorch`): its module, datamodule and Lightning's CLI come from there. `$CLI_HIDE` names a package
made uninstalled for this process (tests/conformance/hidden_package.py), to show the program needs only its own.

`cli`: `LightningCLI(Model, Data, ...)` with subcommands; `subclass`: a LightningCLI subclass that adds
and links an argument and runs a `before_fit` hook, with a `SaveConfigCallback` subclass and a Lightning callback
in `trainer_defaults`; `no_run`: `run=False`, then the program calls
`cli.trainer.fit` itself. Each process writes what the program ended with to `$CLI_RESULTS/rank<r>.json` (under Lightning's
`ddp` rank 1 runs the program too).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.conformance.hidden_package import hide_packages

hide_packages(os.environ.get("CLI_HIDE", ""))
PACKAGE = os.environ.get("CLI_PACKAGE", "pytorch_lightning")
pl: Any = importlib.import_module(PACKAGE)

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Model(pl.LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.1, features: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def _loss(self, batch: Any) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int = 4, samples: int = 32, features: int = 4) -> None:
        super().__init__()
        self.batch_size, self.samples, self.features = batch_size, samples, features

    def _loader(self, seed: int) -> DataLoader:
        x = torch.randn(self.samples, self.features, generator=torch.Generator().manual_seed(seed))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size)

    def train_dataloader(self) -> DataLoader:
        return self._loader(0)

    def val_dataloader(self) -> DataLoader:
        return self._loader(1)

    def test_dataloader(self) -> DataLoader:
        return self._loader(2)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(3)


def _cli_class(which: str) -> type:
    if which == "ours":
        from trainer.lightning_cli import LightningCLI

        return LightningCLI
    return importlib.import_module(f"{PACKAGE}.cli").LightningCLI  # type: ignore[no-any-return]


def _save_config_class(which: str) -> type:
    base: Any = importlib.import_module("trainer.lightning_cli" if which == "ours" else f"{PACKAGE}.cli").SaveConfigCallback

    class MarkingSaveConfig(base):  # type: ignore[misc]
        """Lightning's documented customisation of where the config goes: here, also a mark on the module."""

        def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
            super().save_config(trainer, pl_module, stage)
            pl_module.config_saved_in = stage

    return MarkingSaveConfig


def _subclass(base: type) -> type:
    class LinkedCLI(base):  # type: ignore[misc, valid-type]
        """Lightning's documented customisation: a linked argument and a hook before fit."""

        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.link_arguments("data.features", "model.features")

        def before_fit(self) -> None:
            self.model.before_fit_ran = True

    return LinkedCLI


def _result(cli: Any, outputs: Any = None) -> dict[str, Any]:
    trainer = cli.trainer
    loaded = sorted(name for name in ("lightning", "pytorch_lightning") if sys.modules.get(name) is not None)
    return {"trainer": type(trainer).__module__.split(".")[0], "rank": trainer.global_rank, "loaded": loaded,
            "global_step": trainer.global_step,
            "metrics": {key: round(float(value), 5) for key, value in sorted(trainer.callback_metrics.items())},
            "hparams": dict(cli.model.hparams), "before_fit": getattr(cli.model, "before_fit_ran", False),
            "config_saved_in": getattr(cli.model, "config_saved_in", None),
            "early_stopping": [type(c).__module__.split(".")[0] for c in trainer.callbacks
                               if type(c).__name__ == "EarlyStopping"],
            "log_dir": trainer.log_dir, "outputs": outputs,
            "weights": round(float(sum(p.detach().sum() for p in cli.model.parameters())), 5)}


def _write(result: dict[str, Any]) -> None:
    folder = Path(os.environ["CLI_RESULTS"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{result['rank']}.json").write_text(json.dumps(result))


def main() -> None:
    which, mode, *arguments = sys.argv[1:]
    base = _cli_class(which)
    cli_class = _subclass(base) if mode == "subclass" else base
    common = {"seed_everything_default": 3, "save_config_kwargs": {"overwrite": True}, "args": arguments}
    if mode == "no_run":
        cli = cli_class(Model, Data, run=False, **common)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        outputs = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
        _write(_result(cli, outputs))
        return
    if mode == "subclass":
        common["save_config_callback"] = _save_config_class(which)
        common["trainer_defaults"] = {"callbacks": [pl.callbacks.EarlyStopping(monitor="val_loss", patience=3)]}
    cli = cli_class(Model, Data, **common)
    _write(_result(cli))


if __name__ == "__main__":
    main()
