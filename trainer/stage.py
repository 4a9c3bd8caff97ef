"""What one stage's loops use, handed to them instead of the whole Trainer (issue #41).

run.py builds the stage's `Stage` once the strategy has set the module up and hands it to every loop driver
(the fit loop included), to checkpoint loading and to the optimizers `self.optimizers()` returns. Only code
reached through an API that hands over the Trainer alone builds one where it needs it (`Stage.of`: the same
parts by reference, about 4 us): the module's `manual_backward` (it holds `self.trainer`),
`Trainer.save_checkpoint` (callbacks call it), `Trainer.estimated_stepping_batches` (configure_optimizers
asks), and the loggers' finalisation of a stage that failed before its Stage was built. It holds:

* the Trainer's parts, by reference (the same objects the Trainer answers from, so what the loops
  change, the Trainer reports, and what a callback changes on the Trainer, the loops see);
* `fixed`: the settings Lightning keeps private or read-only for a Trainer's life, as one frozen record;
* `live`: the settings a user, a callback or the tuner may change while the stage runs (limits,
  `accumulate_grad_batches`, max_epochs, `val_check_interval`, ...: plain attributes of Lightning's
  Trainer), read when used;
* `attached`: what the stage attaches to the Trainer as it runs (the set-up module, the optimizers), read
  when used;
* `trainer`: the Trainer typed as its contract (trainer/contract.py), only to hand to user hooks.

It answers the fit's schedule (trainer/schedule.py's `FitSchedule`: progress, `should_stop` and the
schedule's settings) by reading its parts and `live` at each call, as the Trainer does, so one set of
rules serves both.

A leaf: it imports no loop, and knows the Trainer only through protocols (`StageOwner` extends the
contract with the parts), which mypy checks the Trainer against.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from trainer.contract import TrainerContract
from trainer.data_sources import DataSources, LoaderSource
from trainer.logged_metrics import MetricStore
from trainer.precision import Precision
from trainer.schedule import ScheduleSettings
from trainer.state import FitProgress, FitRun, TrainerStatus

if TYPE_CHECKING:
    from datetime import timedelta

    from strategies.base import Strategy


class HookCalls(Protocol):
    """How the loops call hooks (and checkpointing keeps the callbacks' states): the Trainer's callback list
    (trainer/callbacks/dispatch.py), by what it does, so that this module stays out of the callbacks' imports."""

    def call(self, hook: str, trainer: TrainerContract, module: nn.Module, *args: Any, **kwargs: Any) -> Any: ...

    def call_epoch_end(self, hook: str, trainer: TrainerContract, module: nn.Module,
                       before_monitoring: Any = None) -> None: ...

    def call_callbacks(self, hook: str, trainer: TrainerContract, module: nn.Module, *args: Any,
                       monitoring: bool | None = None, **kwargs: Any) -> None: ...

    def call_module(self, hook: str, module: Any, *args: Any, **kwargs: Any) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...  # the callbacks' states, for a checkpoint

    def load_state_dict(self, states: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class FixedSettings:
    """Settings no hook can change during a stage (Lightning keeps them private or read-only)."""

    use_distributed_sampler: bool
    inference_mode: bool
    detect_anomaly: bool
    on_nonfinite: str


class LiveSettings(ScheduleSettings, Protocol):
    """The Trainer's settings that may change while a stage runs (the tuner sets the limits, a callback
    `accumulate_grad_batches` or `num_sanity_val_steps`, `trainer.fit_loop.max_epochs = n` trains on; plain
    attributes of Lightning's Trainer): read at the point of use. The schedule's own (max_epochs, ...) come
    from trainer/schedule.py's `ScheduleSettings`."""

    @property
    def limit_train_batches(self) -> int | float: ...
    @property
    def limit_test_batches(self) -> int | float: ...
    @property
    def limit_predict_batches(self) -> int | float: ...
    @property
    def overfit_batches(self) -> int | float: ...
    @property
    def num_sanity_val_steps(self) -> int: ...
    @property
    def gradient_clip_val(self) -> float | None: ...
    @property
    def gradient_clip_algorithm(self) -> str | None: ...
    @property
    def reload_dataloaders_every_n_epochs(self) -> int: ...
    @property
    def log_every_n_steps(self) -> int: ...


class Attached(Protocol):
    """What a stage attaches to the Trainer while it runs (the module the strategy set up, configure_optimizers'
    results) or a hook may replace (`trainer.logger = ...`): read when used."""

    @property
    def lightning_module(self) -> nn.Module | None: ...
    @property
    def datamodule(self) -> Any: ...
    @property
    def loggers(self) -> list[Any]: ...
    @property
    def optimizers(self) -> list[Any]: ...
    @property
    def wrapped_optimizers(self) -> list[Any]: ...
    @property
    def lr_scheduler_configs(self) -> list[Any]: ...
    @property
    def ckpt_path(self) -> str | os.PathLike[str] | None: ...  # the checkpoint the stage started from


class StageOwner(TrainerContract, LiveSettings, Attached, Protocol):
    """What a Stage is built from: the Trainer (mypy checks it, trainer/trainer.py), its parts and settings."""

    @property
    def callback_list(self) -> HookCalls: ...
    @property
    def metric_store(self) -> MetricStore: ...
    @property
    def data(self) -> DataSources: ...
    @property
    def progress(self) -> FitProgress: ...
    @property
    def fit_run(self) -> FitRun: ...
    @property
    def state(self) -> TrainerStatus: ...
    @property
    def precision_plugin(self) -> Precision: ...
    @property
    def profiler(self) -> Any: ...
    @property
    def use_distributed_sampler(self) -> bool: ...
    @property
    def inference_mode(self) -> bool: ...
    @property
    def detect_anomaly(self) -> bool: ...
    @property
    def on_nonfinite(self) -> str: ...


@dataclass(frozen=True)
class Stage:
    """One stage's view of the Trainer: its parts, its settings, and the Trainer for user hooks."""

    trainer: TrainerContract  # only to hand to callbacks and module hooks
    strategy: Strategy
    callbacks: HookCalls
    metrics: MetricStore
    data: DataSources
    progress: FitProgress
    fit_run: FitRun  # replaced by run.py as a fit starts, before the Stage is built
    status: TrainerStatus
    precision: Precision
    profiler: Any
    fixed: FixedSettings
    live: LiveSettings
    attached: Attached

    @classmethod
    def of(cls, owner: StageOwner) -> Stage:
        """The Stage of the Trainer `owner` as it is now (run.py: once the strategy has set the module up)."""
        fixed = FixedSettings(use_distributed_sampler=owner.use_distributed_sampler,
                              inference_mode=owner.inference_mode, detect_anomaly=owner.detect_anomaly,
                              on_nonfinite=owner.on_nonfinite)
        return cls(trainer=owner, strategy=owner.strategy, callbacks=owner.callback_list,
                   metrics=owner.metric_store, data=owner.data, progress=owner.progress, fit_run=owner.fit_run,
                   status=owner.state, precision=owner.precision_plugin, profiler=owner.profiler, fixed=fixed,
                   live=owner, attached=owner)

    @property
    def module(self) -> nn.Module | None:
        return self.attached.lightning_module

    @property
    def datamodule(self) -> Any:
        return self.attached.datamodule

    @property
    def loggers(self) -> list[Any]:
        return self.attached.loggers

    # The fit's schedule (trainer/schedule.py's FitSchedule), answered as the Trainer answers it.
    @property
    def current_epoch(self) -> int:
        return self.progress.current_epoch

    @property
    def global_step(self) -> int:
        return self.progress.global_step

    @property
    def should_stop(self) -> bool:
        return self.fit_run.should_stop

    @property
    def num_training_batches(self) -> int | float:
        return self.data.counts.train

    @property
    def enable_validation(self) -> bool:
        return self.data.validates(self.datamodule, self.module, self.live.limit_val_batches)

    @property
    def max_epochs(self) -> int | None:
        return self.live.max_epochs

    @property
    def min_epochs(self) -> int | None:
        return self.live.min_epochs

    @property
    def max_steps(self) -> int:
        return self.live.max_steps

    @property
    def min_steps(self) -> int | None:
        return self.live.min_steps

    @property
    def max_time(self) -> timedelta | None:
        return self.live.max_time

    @property
    def val_check_interval(self) -> int | float:
        return self.live.val_check_interval

    @property
    def check_val_every_n_epoch(self) -> int | None:
        return self.live.check_val_every_n_epoch

    @property
    def limit_val_batches(self) -> int | float:
        return self.live.limit_val_batches

    @property
    def accumulate_grad_batches(self) -> int:
        return self.live.accumulate_grad_batches

    def loader_source(self) -> LoaderSource:
        """What the data sources request this stage's loaders from, read now."""
        return LoaderSource(strategy=self.strategy, datamodule=self.datamodule, module=self.module,
                            call_module_hook=self.callbacks.call_module,
                            distributed_sampler=self.fixed.use_distributed_sampler,
                            overfit=bool(self.live.overfit_batches) and self.status.fn == "fit")
