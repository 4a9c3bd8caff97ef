"""What the fit-then-test job (`benchmarks/stages.py`) runs, whichever Trainer runs it: the two
workloads, the `test_step`s they add, and the settings every contender uses.

No framework is imported here: `stages_ours.py` and `stages_pl.py` mix these into their own
`LightningModule`s. Everything a worker unpickles lives in importable modules (not `__main__`),
since the checkout before #17 sends the module to its workers by reference.
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.workloads import BenchSteps, Workload, loss_fn

SEED = 42
RANKS = 2
# The CLI's default job (conf/model/digits_mlp.yaml, conf/data/digits.yaml, conf/trainer/default.yaml).
DIGITS_MODEL: dict[str, Any] = {"arch": "mlp", "hidden_sizes": [256], "dropout": 0.0, "lr": 3e-3, "optimizer": "adam",
                "weight_decay": 0.0, "scheduler": None}
DIGITS_DATA: dict[str, Any] = {"batch_size": 64, "val_fraction": 0.2, "seed": 0, "num_workers": 0}
DIGITS_EPOCHS = 10
# The `digits_workers` workload: the same job with DataLoader worker processes inside each rank, which
# start every epoch (and stage) as the platform starts them: fork on Linux, under either Trainer.
DIGITS_LOADER_WORKERS = 2


def digits_data(workload: str) -> dict[str, Any]:
    """The digits DataModule's arguments for `workload` ("digits" or "digits_workers")."""
    return {**DIGITS_DATA, "num_workers": DIGITS_LOADER_WORKERS if workload == "digits_workers" else 0}
BIG_STEPS = 4  # training steps per rank, and test batches per rank, of the large MLP (1 epoch)
# Where each rank notes which `trainer`/`strategies` it imported (the harness checks the "before" checkout).
CODE_NOTES_ENV = "BENCH_STAGES_NOTES"


def trainer_settings(out: str) -> dict[str, Any]:
    """The same Trainer arguments for every contender: nothing runs but the loops."""
    return {"accelerator": "cpu", "devices": RANKS, "strategy": "ddp", "logger": False, "enable_checkpointing": False,
            "enable_progress_bar": False, "enable_model_summary": False, "num_sanity_val_steps": 0,
            "default_root_dir": out}


# ---------------------------------------------------------------------- >= 50M parameters: start-up bound
def _big_mlp() -> nn.Module:
    """1024 -> 4096 -> 4096 -> 4096 -> 4096 -> 10: 54.6M parameters (208 MiB of fp32 weights)."""
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096),
                         nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))


def _big_inputs(samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(samples, 1024, generator=generator), torch.randint(0, 10, (samples,), generator=generator)


BIG_MLP = Workload("mlp50m", "start-up-bound", 8, _big_mlp, _big_inputs)


class BigSteps(BenchSteps):
    """The benchmark workloads' training step (BenchSteps) plus a test step: the loss, averaged over ranks."""

    def on_fit_start(self) -> None:
        note_code(self)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", loss_fn(self.model, batch), sync_dist=True)  # type: ignore[attr-defined]
        log_threads(self)


# ---------------------------------------------------------------------- digits: the CLI's default job
def digits_hparams(source: Any) -> dict[str, Any]:
    """Every constructor argument of `DigitsClassifier` (its defaults + the CLI's values)."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(source).parameters.items()}
    return {**defaults, **DIGITS_MODEL}


class DigitsTestStep:
    """The digits classifier has no `test_step` (the CLI only fits): this one scores the validation
    split, as its `validation_step` does, under test names. Mixed in before the classifier."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from torchmetrics.classification import MulticlassAccuracy

        self.test_acc = MulticlassAccuracy(num_classes=10, average="micro")

    def on_fit_start(self) -> None:
        note_code(self)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)  # type: ignore[operator]
        self.test_acc(logits, y)
        self.log("test_loss", F.cross_entropy(logits, y), sync_dist=True)  # type: ignore[attr-defined]
        self.log("test_acc", self.test_acc, sync_dist=True)  # type: ignore[attr-defined]
        log_threads(self)


def log_threads(module: Any) -> None:
    """Each rank's torch threads, as a test metric (max over ranks): the harness checks 2 ranks x 1 thread."""
    module.log("threads", float(torch.get_num_threads()), sync_dist=True, reduce_fx="max")


def note_code(module: Any) -> None:
    """Write which `trainer` and `strategies` this rank runs (only when the harness asks)."""
    notes = os.environ.get(CODE_NOTES_ENV)
    if not notes:
        return
    found = {name: os.path.realpath(sys.modules[name].__file__ or "") for name in ("trainer", "strategies")
             if name in sys.modules}
    rank = getattr(module, "global_rank", 0)
    Path(notes).mkdir(parents=True, exist_ok=True)
    (Path(notes) / f"rank{rank}-{os.getpid()}.txt").write_text(repr(found))
