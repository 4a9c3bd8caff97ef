"""One unchanged Lightning program about data and what a program reads back, run as a script under
Lightning's Trainer or ours, on 1 or 2 CPU processes (`strategy="ddp"` at 2, Lightning's own `ddp`,
which re-runs this command line for rank 1; the caller is global rank 0 under both):

    DATA_STAGES_PACKAGE={lightning.pytorch|pytorch_lightning} \\
        python -m tests.conformance.data_stages_script {lightning|ours} {1|2} {tensorboard|csv} OUT_DIR

It fits on a loader with a `WeightedRandomSampler`, tests on one, predicts on a shuffling loader and
on a weighted one, fits again with nothing left to train, then fits a fresh Trainer on a stream without
a length. Each rank appends what its steps saw (sample ids, `is_last_batch`) to `OUT_DIR/rank<N>.jsonl`;
the caller writes `OUT_DIR/caller.json`: its torch random state after every stage, the predictions in
the order returned, the keys of the three metrics dicts, and the files of the logger's version folder.
The package is read from the environment because our Trainer's workers import this module again.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, WeightedRandomSampler

pl: Any = importlib.import_module(os.environ.get("DATA_STAGES_PACKAGE", "pytorch_lightning"))
SIZE = 24  # divisible by 2: both Trainers hand each rank the same evaluation samples


class Numbered(Dataset):
    """Sample `i` is `(i, x_i, y_i)`: a step can say which samples it saw."""

    def __init__(self, n: int = SIZE) -> None:
        generator = torch.Generator().manual_seed(3)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return index, self.x[index], self.y[index]


class Stream(IterableDataset):
    """A stream without a length: a loader over it knows its last batch only by looking ahead."""

    def __iter__(self) -> Any:
        data = Numbered(10)
        return (data[i] for i in range(len(data)))


class Model(pl.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out
        self.net = nn.Linear(4, 1)

    def _record(self, **entry: Any) -> None:
        with open(Path(self.out, f"rank{self.global_rank}.jsonl"), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._record(stage="fit", epoch=self.current_epoch, ids=batch[0].tolist(),
                     is_last_batch=bool(self.trainer.is_last_batch))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", nn.functional.mse_loss(self.net(batch[1]), batch[2]), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._record(stage="test", ids=batch[0].tolist())
        self.log("test_loss", nn.functional.mse_loss(self.net(batch[1]), batch[2]), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        self._record(stage="predict", ids=batch[0].tolist())
        return batch[0], self.net(batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _weighted(seed_offset: int = 0) -> DataLoader:
    weights = torch.linspace(0.2, 1.0, SIZE) + seed_offset
    return DataLoader(Numbered(), batch_size=4, sampler=WeightedRandomSampler(weights, num_samples=SIZE))


def _random_state() -> str:
    return hashlib.sha1(torch.random.get_rng_state().numpy().tobytes()).hexdigest()[:12]


def _keys(trainer: Any) -> dict[str, list[str]]:
    return {"callback_metrics": sorted(trainer.callback_metrics), "logged_metrics": sorted(trainer.logged_metrics),
            "progress_bar_metrics": sorted(trainer.progress_bar_metrics)}


def _files(folder: str) -> list[str]:
    """The version folder's files, event files by kind (their names hold the host and the time)."""
    names = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            name = str(path.relative_to(folder))
            names.append(name.split(".out.tfevents.")[0] + ".out.tfevents.*" if ".out.tfevents." in name else name)
    return sorted(names)


def _predictions(batches: Any) -> list[list[Any]]:
    return [[ids.tolist(), [round(v, 5) for v in out.flatten().tolist()]] for ids, out in batches]


def _make_trainer(kind: str, devices: int, logger: Any, out: Path, **kwargs: Any) -> Any:
    if kind == "lightning":
        make: Any = pl.Trainer
    else:
        from trainer import Trainer as make
    return make(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", logger=logger,
                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                log_every_n_steps=1, default_root_dir=str(out), **kwargs)


def _logger(kind: str, logger_kind: str, out: Path) -> Any:
    if kind == "lightning":
        package: Any = pl.loggers
    else:
        import trainer.loggers as package
    make = package.TensorBoardLogger if logger_kind == "tensorboard" else package.CSVLogger
    return make(str(out), name="logs")


def main(kind: str, devices: int, logger_kind: str, out: Path) -> None:
    pl.seed_everything(7, verbose=False)
    caller: dict[str, Any] = {"random": {}}
    logger = _logger(kind, logger_kind, out)
    trainer = _make_trainer(kind, devices, logger, out, max_epochs=2)
    model = Model(str(out))
    trainer.fit(model, _weighted(), DataLoader(Numbered(), batch_size=4))
    caller["random"]["fit"] = _random_state()
    caller["keys"] = _keys(trainer)
    trainer.test(model, _weighted(1), verbose=False)
    caller["random"]["test"] = _random_state()
    shuffled = trainer.predict(model, DataLoader(Numbered(), batch_size=4, shuffle=True))
    caller["random"]["predict_shuffled"] = _random_state()
    weighted = trainer.predict(model, _weighted(2))
    caller["random"]["predict_weighted"] = _random_state()
    trainer.fit(model, _weighted(), DataLoader(Numbered(), batch_size=4))  # max_epochs reached: trains nothing
    caller["random"]["fit_again"] = _random_state()
    caller["predictions"] = {"shuffled": _predictions(shuffled), "weighted": _predictions(weighted)}
    caller["logger_files"] = _files(logger.log_dir)
    stream_trainer = _make_trainer(kind, devices, False, out / "stream", max_epochs=1)
    stream_trainer.fit(Model(str(out)), DataLoader(Stream(), batch_size=4))
    caller["random"]["stream_fit"] = _random_state()
    if trainer.global_rank == 0:
        Path(out, "caller.json").write_text(json.dumps(caller, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
