"""The corpus cases: which module and data to build after `seed_everything(0)`, the Trainer
arguments both Trainers get, the user's callbacks, and the stages to run in order."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.conformance import corpus
from tests.conformance.corpus import (AccumulateModule, BatchNormModule, ClassificationData, ClipModule,
                                      CustomClipModule, DictData, EpochLossModule, HooksModule, HParamsModule,
                                      LazyModule, LoggingModule, ManualGAN, NoisyData, RankShiftedData, RegressionData,
                                      Regressor, SCHEDULER_FORMS, SchedulerModule, TemplateModule, TransferModule, TwoLoaderData,
                                      TwoLoadersModule, UnifiedClassificationData, UnifiedHooksModule,
                                      UnifiedTemplateModule)


def _recorded_class(cls: type) -> type:
    return getattr(corpus, f"Recorded{cls.__name__}")


@dataclass(frozen=True)
class Case:
    """One corpus entry. `callbacks(callbacks_package, checkpoint_dir)` builds the user's callbacks
    from the case's Lightning package; `reload` loads the best checkpoint with
    `load_from_checkpoint` after the stages; `fast` cases run in the default (unmarked) suite;
    `find_unused_parameters` picks the DDP strategy name real projects need for the module (a GAN's
    toggled optimizers leave parameters without gradients)."""

    name: str
    module: Callable[[], Any]
    data: Callable[[], Any] | None = None
    trainer: Mapping[str, Any] = field(default_factory=dict)
    stages: tuple[tuple[str, Mapping[str, Any]], ...] = (("fit", {}),)
    callbacks: Callable[[Any, str], list[Any]] = lambda package, dirpath: []
    package: str = "pytorch_lightning"
    reload: bool = False
    fast: bool = False
    find_unused_parameters: bool = False  # under DDP: "ddp(_spawn)_find_unused_parameters_true" in both


def _build(cls: type, *args: Any) -> Callable[[], Any]:
    return lambda: _recorded_class(cls)(*args)


def _template_callbacks(package: Any, dirpath: str) -> list[Any]:
    return [package.ModelCheckpoint(dirpath=dirpath, filename="epoch_{epoch:03d}", monitor="val/acc", mode="max",
                                    save_last=True, auto_insert_metric_name=False),
            package.EarlyStopping(monitor="val/acc", patience=2, mode="max")]


def _best_and_last(package: Any, dirpath: str) -> list[Any]:
    return [package.ModelCheckpoint(dirpath=dirpath, monitor="val_loss", save_top_k=2, save_last=True)]


_ALL_STAGES: tuple[tuple[str, Mapping[str, Any]], ...] = (("fit", {}), ("validate", {}), ("test", {}), ("predict", {}))
_EVERY_BATCH = {"max_epochs": 2, "log_every_n_steps": 1}

_CASE_LIST = [
    Case("template", _build(TemplateModule), _build(ClassificationData), {"max_epochs": 3},
         (("fit", {}), ("test", {"ckpt_path": "best"})), _template_callbacks, fast=True),
    Case("template_unified", _build(UnifiedTemplateModule), _build(UnifiedClassificationData), {"max_epochs": 3},
         (("fit", {}), ("test", {"ckpt_path": "best"})), _template_callbacks, package="lightning.pytorch"),
    # Progress bar and model summary left at their defaults here (the case that checks them).
    Case("hooks_defaults", _build(HooksModule), None,
         {"max_epochs": 2, "enable_progress_bar": None, "enable_model_summary": None}, _ALL_STAGES, fast=True),
    Case("hooks_unified", _build(UnifiedHooksModule), None, {"max_epochs": 2}, _ALL_STAGES,
         package="lightning.pytorch", fast=True),
    Case("logging", _build(LoggingModule), lambda: _recorded_class(RegressionData)(train=60, shuffle=True),
         _EVERY_BATCH, (("fit", {}), ("validate", {}), ("test", {})), fast=True),
    # A training loader built with shuffle=False: under DDP both Trainers still shuffle its shards.
    Case("unshuffled_train", _build(Regressor), lambda: _recorded_class(RegressionData)(shuffle=False),
         {"max_epochs": 2}),
    # Limits on a dataset with random augmentation: no Trainer may fetch a batch past a limit.
    Case("limited_noisy", _build(Regressor), _build(NoisyData),
         {"max_epochs": 3, "limit_train_batches": 3, "limit_val_batches": 2, "log_every_n_steps": 1},
         (("fit", {}), ("validate", {}), ("test", {}))),
    # fit() again on the same Trainer once max_epochs is reached: Lightning skips the training run.
    Case("fit_again_done", _build(HooksModule), None, {"max_epochs": 1}, (("fit", {}), ("fit", {}), ("test", {}))),
    Case("two_val_loaders", _build(TwoLoadersModule), _build(TwoLoaderData), _EVERY_BATCH,
         (("fit", {}), ("validate", {}), ("test", {}))),
    Case("manual_two_optimizers", _build(ManualGAN), _build(RegressionData), _EVERY_BATCH, fast=True,
         find_unused_parameters=True),
    *[Case(f"scheduler_{form}", _build(SchedulerModule, form), _build(RegressionData),
           {"max_epochs": 3, "log_every_n_steps": 1}, fast=form == "onecycle") for form in SCHEDULER_FORMS],
    Case("hparams_checkpoint", _build(HParamsModule, 12, 0.02, "conformance", (0.8, 0.95)), _build(RegressionData),
         {"max_epochs": 3}, (("fit", {}), ("test", {"ckpt_path": "last"}), ("validate", {"ckpt_path": "best"})),
         _best_and_last, reload=True),
    Case("configure_model", _build(LazyModule), _build(RegressionData), {"max_epochs": 1},
         (("fit", {}), ("test", {}), ("predict", {}))),
    Case("batch_transfer", _build(TransferModule), _build(DictData), {"max_epochs": 1}, _ALL_STAGES),
    Case("clip_norm", _build(ClipModule), _build(RegressionData),
         {**_EVERY_BATCH, "gradient_clip_val": 0.05, "gradient_clip_algorithm": "norm"}),
    Case("clip_value", _build(ClipModule), _build(RegressionData),
         {**_EVERY_BATCH, "gradient_clip_val": 0.01, "gradient_clip_algorithm": "value"}),
    Case("clip_custom_hook", _build(CustomClipModule), _build(RegressionData),
         {**_EVERY_BATCH, "gradient_clip_val": 0.05}),
    Case("accumulate", _build(AccumulateModule), _build(RegressionData),
         {**_EVERY_BATCH, "accumulate_grad_batches": 3}),
    Case("early_stop_train", _build(EpochLossModule), _build(RegressionData), {"max_epochs": 6},
         callbacks=lambda package, dirpath: [package.EarlyStopping(monitor="train_epoch_loss", patience=1,
                                                                   min_delta=10.0)]),
    Case("early_stop_val", _build(Regressor), _build(RegressionData), {"max_epochs": 6},
         callbacks=lambda package, dirpath: [package.EarlyStopping(monitor="val_loss", patience=1, mode="max")]),
    # BatchNorm and several validations per epoch (the sanity check, then every half epoch): pins
    # torch DDP's buffer-broadcast rule at 2 processes (test_two_processes.py checks it field by field).
    Case("batchnorm_val_check", _build(BatchNormModule), _build(RankShiftedData),
         {"max_epochs": 2, "val_check_interval": 0.5, "log_every_n_steps": 1}),
]
CASES: dict[str, Case] = {case.name: case for case in _CASE_LIST}
# Run at 2 processes too (Lightning ddp_spawn vs our ddp).
# (fit_again_done is not among them: Lightning's ddp_spawn refuses a second fit on one Trainer; a second fit
# at 2 processes is compared against Lightning's ddp in test_caller_state.py.)
TWO_PROCESS_CASES = ("template", "logging", "manual_two_optimizers", "hparams_checkpoint", "unshuffled_train",
                     "limited_noisy")
