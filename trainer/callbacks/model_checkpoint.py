"""ModelCheckpoint: Lightning's checkpoint callback (when to save, which files to keep).

This file holds the hooks and the bookkeeping of each save event (which files to write, keep and
delete). Its rules live beside it in trainer/callbacks/: when a save is due (save_schedule.py), how
scores rank (top_k.py), and where files go and what they are called (checkpoint_files.py).

Every rank runs the same hooks. Whatever depends on metrics or on the file system (is this
score in the top k? which file falls out? is the name taken?) is decided on global rank 0 and
broadcast as one plan, so every rank then takes the same collective path, in the same order:
`trainer.save_checkpoint` and `trainer.strategy.remove_checkpoint` (principle 14).
"""

from __future__ import annotations

import os
import typing
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
from typing_extensions import override

from trainer.callbacks.base import Callback
from trainer.callbacks.checkpoint_files import (default_dirpath, find_last_files, format_filename, normalise_dirpath,
                                                replace_with_link)
from trainer.callbacks.save_schedule import SaveSchedule
from trainer.callbacks.top_k import WORST, best_and_worst, enters_top_k, score_of, validate_ranking
from trainer.contract import TrainerContract


class ModelCheckpoint(Callback):
    """Save checkpoints periodically and keep the `save_top_k` best by `monitor`: Lightning's
    callback with its arguments, file names (`epoch=3-step=120-val_acc=0.970.ckpt`, `last.ckpt`,
    `-v1` on clashes) and resumable state."""

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None,
                 monitor: str | None = None, verbose: bool = False, save_last: bool | Literal["link"] | None = None,
                 save_top_k: int = 1, save_weights_only: bool = False, mode: Literal["min", "max"] = "min",
                 auto_insert_metric_name: bool = True, every_n_train_steps: int | None = None,
                 every_n_epochs: int | None = None, save_on_train_epoch_end: bool | None = None,
                 enable_version_counter: bool = True, save_on_exception: bool = False,
                 train_time_interval: timedelta | None = None) -> None:
        validate_ranking(monitor, mode, save_top_k)
        if save_last not in (None, True, False, "link"):
            raise ValueError(f"ModelCheckpoint(save_last={save_last!r}) is not supported; expected True, False, "
                             "'link' or None.")
        self._schedule = SaveSchedule(every_n_train_steps, every_n_epochs, train_time_interval, save_on_train_epoch_end)
        self.dirpath = normalise_dirpath(dirpath)
        self.filename, self.monitor, self.mode, self.verbose = filename, monitor, mode, verbose
        self.save_last, self.save_top_k, self.save_weights_only = save_last, save_top_k, save_weights_only
        self.auto_insert_metric_name = auto_insert_metric_name
        self._enable_version_counter = enable_version_counter
        self.save_on_exception = bool(save_on_exception)
        self.best_k_models: dict[str, torch.Tensor] = {}
        self.kth_best_model_path = ""
        self.kth_value = torch.tensor(WORST[mode])
        self.best_model_score: torch.Tensor | None = None
        self.best_model_path = ""
        self.last_model_path = ""
        self.current_score: torch.Tensor | None = None
        self._last_global_step_saved = 0  # like Lightning: nothing is saved before the first step
        self._last_checkpoint_saved = ""  # the newest file written, what save_last="link" points to
        self._fitting = False
        self._save_at_validation_end = False  # a step/time trigger waits for the validation metric it monitors
        self._resumed_from: str | None = None  # the fit's ckpt_path: never deleted by top-k

    @property
    @override
    def state_key(self) -> str:
        schedule = self._schedule
        settings = {"monitor": self.monitor, "mode": self.mode, "every_n_train_steps": schedule.every_n_train_steps,
                    "every_n_epochs": schedule.every_n_epochs, "train_time_interval": schedule.train_time_interval}
        return f"{type(self).__qualname__}{settings!r}"

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: TrainerContract, pl_module: Any, stage: str) -> None:
        self._fitting = stage == "fit"
        self.dirpath = trainer.strategy.broadcast(self._resolve_dirpath(trainer))
        if self.save_last == "link" and "://" in str(self.dirpath):
            raise ValueError(f"ModelCheckpoint(save_last='link') makes a symbolic link, which needs a local directory; "
                             f"dirpath={self.dirpath!r} is not one. Use save_last=True there.")

    @override
    def teardown(self, trainer: TrainerContract, pl_module: Any, stage: str) -> None:
        self._fitting = False

    @override
    def on_train_batch_end(self, trainer: TrainerContract, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._schedule.steps_due(trainer) and not self._skip(trainer):
            self._save_or_wait_for_validation(trainer)
        elif self._schedule.time_due(trainer) and not self._skip(trainer):
            self._save_or_wait_for_validation(trainer)
            self._schedule.restart_clock()

    def _save_or_wait_for_validation(self, trainer: TrainerContract) -> None:
        """A step or time trigger. When the monitored metric is a validation one that does not exist
        yet, or that the validation about to run (after the epoch's last batch) will renew, the
        save happens at that validation's end instead (Lightning's rule)."""
        if self._waits_for_validation(trainer):
            self._save_at_validation_end = True
            return
        self._save(trainer, top_k=True)

    def _waits_for_validation(self, trainer: TrainerContract) -> bool:
        if self.monitor is None:
            return False
        if self.monitor not in self._monitor_candidates(trainer):  # (epoch and step are always there)
            return True
        if self._schedule.at_train_epoch_end(trainer) or not trainer.is_last_batch:
            return False
        every_n_epochs = trainer.check_val_every_n_epoch
        return bool(trainer.enable_validation and sum(trainer.num_val_batches) > 0
                    and (every_n_epochs is None or (trainer.current_epoch + 1) % every_n_epochs == 0))

    @override
    def on_train_start(self, trainer: TrainerContract, pl_module: Any) -> None:
        self._schedule.restart_clock()

    @override
    def on_exception(self, trainer: TrainerContract, pl_module: Any, exception: BaseException) -> None:
        """save_on_exception: keep the weights reached when fitting failed (one process only: under DDP
        a rank that raised alone would wait forever for its peers inside the save)."""
        if not (self.save_on_exception and self._fitting) or trainer.sanity_checking or trainer.fast_dev_run:
            return
        if self._last_global_step_saved == trainer.global_step:
            return
        if trainer.world_size > 1:
            warnings.warn("ModelCheckpoint(save_on_exception=True) saves only in single-process runs; under DDP "
                          "the other ranks may not reach the save. Use periodic checkpoints (every_n_train_steps).")
            return
        path = self._free_path(self._monitor_candidates(trainer), None, "")
        trainer.save_checkpoint(path, self.save_weights_only)
        self._last_global_step_saved = trainer.global_step
        trainer.print(f"{type(exception).__name__} raised: saved checkpoint to {path}")

    def to_yaml(self, filepath: str | os.PathLike[str] | None = None) -> None:
        """Write `best_k_models` (path -> score) to a YAML file (default: dirpath/best_k_models.yaml)."""
        import yaml

        if filepath is None:
            if self.dirpath is None:
                raise ValueError("ModelCheckpoint.to_yaml() needs a filepath before the callback has a dirpath.")
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        with open(filepath, "w") as handle:
            yaml.dump({path: float(score) for path, score in self.best_k_models.items()}, handle)

    @override
    def on_train_epoch_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        if self._schedule.at_train_epoch_end(trainer) and not self._skip(trainer):
            self._save(trainer, top_k=self._schedule.epoch_due(trainer), last_needs_top_k=True)

    @override
    def on_validation_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        if self._schedule.at_train_epoch_end(trainer) or self._skip(trainer):
            return
        if self._save_at_validation_end:
            self._save_at_validation_end = False
            self._save(trainer, top_k=True)
        else:
            self._save(trainer, top_k=self._schedule.epoch_due(trainer), last_needs_top_k=True)

    @override
    def on_train_end(self, trainer: TrainerContract, pl_module: Any) -> None:
        """save_last promises a `last.ckpt`: written now when no trigger wrote any checkpoint."""
        if self._save_at_validation_end:
            warnings.warn(f"ModelCheckpoint(monitor={self.monitor!r}): a step or time trigger waited for that "
                          "metric from validation, but no validation logged it, so that checkpoint was not written. "
                          "Log the metric, or monitor one that training logs.", RuntimeWarning)
            self._save_at_validation_end = False
        if self.save_last and not self._last_checkpoint_saved and self._fitting and not trainer.fast_dev_run:
            self._save(trainer, top_k=False)

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best_model_score": self.best_model_score,
                "best_model_path": self.best_model_path, "current_score": self.current_score,
                "dirpath": self.dirpath, "best_k_models": dict(self.best_k_models),
                "kth_best_model_path": self.kth_best_model_path, "kth_value": self.kth_value,
                "last_model_path": self.last_model_path}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_dir = state_dict.get("dirpath", self.dirpath)
        if self.dirpath is None:  # not set up in this process (the launcher adopting a worker's state)
            self.dirpath = saved_dir
        if saved_dir == self.dirpath:
            for key in ("best_model_score", "current_score", "kth_best_model_path", "kth_value", "last_model_path"):
                setattr(self, key, state_dict.get(key, getattr(self, key)))
            self.best_k_models = dict(state_dict.get("best_k_models", self.best_k_models))
        else:
            warnings.warn(f"ModelCheckpoint dirpath changed from {saved_dir!r} to {self.dirpath!r}: only "
                          "best_model_path is restored; top-k tracking starts afresh in the new directory.")
        self.best_model_path = state_dict["best_model_path"]

    # ------------------------------------------------------------------ names
    def format_checkpoint_name(self, metrics: dict[str, Any], filename: str | None = None,
                               ver: int | None = None, prefix: str | None = None) -> str:
        """The path for `metrics` (`{epoch}`, `{step}` and logged keys, with format specs),
        `prefix` joined in front and `-v{ver}` behind."""
        name = self._format_checkpoint_name(filename or self.filename, metrics, prefix, self.auto_insert_metric_name)
        if ver is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join((name, f"v{ver}"))
        name += self.FILE_EXTENSION
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def _format_checkpoint_name(self, filename: str | None, metrics: dict[str, Any], prefix: str | None = None,
                                auto_insert_metric_name: bool = True) -> str:
        """The file name without directory and extension (the join and equals characters are read
        from the instance, so a subclass or instance may change them)."""
        return format_filename(filename, metrics, prefix, auto_insert_metric_name, self.CHECKPOINT_JOIN_CHAR,
                               self.CHECKPOINT_EQUALS_CHAR)

    # ------------------------------------------------------------------ saving
    def _skip(self, trainer: TrainerContract) -> bool:
        return (not self._fitting or bool(trainer.fast_dev_run) or trainer.sanity_checking
                or self._last_global_step_saved == trainer.global_step)

    def _save(self, trainer: TrainerContract, top_k: bool, last_needs_top_k: bool = False) -> None:
        """One save event: rank 0 plans, every rank applies that plan and runs its collectives.
        At epoch and validation end, `last` follows only a top-k save of this step (or refreshes a
        link), as in Lightning; step and time triggers always write it."""
        if not (top_k and self.save_top_k != 0) and not self.save_last:
            return  # decided from settings alone, so every rank skips the broadcast together
        plan = self._plan(trainer, top_k, last_needs_top_k) if trainer.is_global_zero else None
        plan = trainer.strategy.broadcast(plan)
        if plan.get("error"):
            raise KeyError(plan["error"])
        if not trainer.is_global_zero:
            self.load_state_dict(plan["state"])
            self._last_checkpoint_saved = plan["newest"]
        for path in plan["save"]:
            if trainer.strategy.async_checkpoint:  # copy now, write on a thread (strategies/async_checkpoint.py)
                trainer.save_checkpoint(path, self.save_weights_only, background=True)
            else:
                trainer.save_checkpoint(path, self.save_weights_only)
            self._last_global_step_saved = trainer.global_step
            self._tell_loggers(trainer)
        if plan.get("link"):
            self._link_checkpoint(trainer, *plan["link"])
        for path in plan["remove"]:
            trainer.strategy.remove_checkpoint(path)
        if self.verbose and plan["message"]:
            trainer.print(plan["message"])

    def _tell_loggers(self, trainer: TrainerContract) -> None:
        """Loggers that track checkpoints (Lightning's `after_save_checkpoint`) hear of each save."""
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if callable(getattr(logger, "after_save_checkpoint", None)):
                logger.after_save_checkpoint(self)

    def _plan(self, trainer: TrainerContract, top_k: bool, last_needs_top_k: bool) -> dict[str, Any]:
        """Rank 0 only: update the bookkeeping and list the files to write and to delete."""
        resumed_from = getattr(trainer, "ckpt_path", None)
        self._resumed_from = os.path.realpath(resumed_from) if resumed_from else None
        metrics = self._monitor_candidates(trainer)
        save: list[str] = []
        remove: list[str] = []
        message = None
        if top_k and self.save_top_k != 0:
            if self.monitor is None:  # save_top_k is 1 (replace the previous file) or -1 (keep all)
                previous, self.best_model_path = self.best_model_path, self._free_path(
                    metrics, None, self.best_model_path)
                save.append(self.best_model_path)
                if self.save_top_k == 1:
                    self._remove_if_ours(previous, self.best_model_path, remove)
            elif self.monitor in metrics:
                message = self._plan_monitored(metrics[self.monitor], metrics, save, remove)
            else:
                return {"error": self._missing_message(metrics)}
        self._last_checkpoint_saved = save[-1] if save else self._last_checkpoint_saved
        link = None
        wants_last = bool(save) or not last_needs_top_k or (self.save_last == "link" and self._last_checkpoint_saved)
        if self.save_last and wants_last:
            previous, self.last_model_path = self.last_model_path, self._free_path(
                metrics, self.CHECKPOINT_NAME_LAST, self.last_model_path)
            if self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0:
                link = (self._last_checkpoint_saved, self.last_model_path)
            else:
                save.append(self.last_model_path)
                self._last_checkpoint_saved = self.last_model_path
            self._remove_if_ours(previous, self.last_model_path, remove)
        return {"save": save, "remove": remove, "link": link, "state": self.state_dict(), "message": message,
                "newest": self._last_checkpoint_saved}

    @staticmethod
    def _link_checkpoint(trainer: TrainerContract, filepath: str, linkpath: str) -> None:
        """save_last="link": `last.ckpt` becomes a link to the newest checkpoint, made on global rank 0;
        every rank waits for it."""
        if trainer.is_global_zero:  # once `filepath` is on disk (it may still be written in the background)
            trainer.strategy.after_checkpoint_written(lambda: replace_with_link(filepath, linkpath))
        trainer.strategy.barrier("ModelCheckpoint link")

    def _find_last_checkpoints(self, trainer: TrainerContract) -> set[str]:
        """The `last` files in dirpath (`last.ckpt`, `last-v1.ckpt`, ...: this callback's name and
        extension). `trainer` is part of Lightning's signature for this query; a local directory
        needs nothing from it."""
        return find_last_files(self.dirpath, self.CHECKPOINT_NAME_LAST, self.FILE_EXTENSION)

    @property
    def every_n_epochs(self) -> int:
        """Epochs between saves (0: not by epoch); 1 when no trigger was given."""
        return self._schedule.every_n_epochs

    # Lightning's private names of the triggers, which subclasses written for Lightning's callback read.
    @property
    def _every_n_train_steps(self) -> int:
        return self._schedule.every_n_train_steps

    @property
    def _every_n_epochs(self) -> int:
        return self._schedule.every_n_epochs

    @property
    def _train_time_interval(self) -> timedelta | None:
        return self._schedule.train_time_interval

    @property
    def _save_on_train_epoch_end(self) -> bool | None:
        return self._schedule.save_on_train_epoch_end

    def _plan_monitored(self, value: Any, metrics: dict[str, Any], save: list[str], remove: list[str]) -> str:
        current = score_of(value, self.mode)
        where = f"Epoch {metrics['epoch']}, global step {metrics['step']}: {self.monitor!r}"
        if not enters_top_k(self.best_k_models, self.kth_best_model_path, current, self.save_top_k, self.mode):
            return f"{where} was not in top {self.save_top_k}"
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        dropped = ""
        if len(self.best_k_models) == k:
            dropped = self.kth_best_model_path
            self.best_k_models.pop(dropped)
        path = self._free_path(metrics, None, dropped)
        self.current_score = current
        self.best_k_models[path] = current
        self.best_model_path, worst = best_and_worst(self.best_k_models, self.mode)
        if len(self.best_k_models) == k:
            self.kth_best_model_path, self.kth_value = worst, self.best_k_models[worst]
        self.best_model_score = self.best_k_models[self.best_model_path]
        save.append(path)
        self._remove_if_ours(dropped, path, remove)
        return f"{where} reached {float(current):.5f} (best {float(self.best_model_score):.5f}), saving {path!r}"

    def _free_path(self, metrics: dict[str, Any], filename: str | None, reusable: str) -> str:
        """A path no other file holds (`-v1`, `-v2`, ... appended), except `reusable` itself."""
        path = self.format_checkpoint_name(metrics, filename)
        version = self.STARTING_VERSION
        while self._enable_version_counter and os.path.exists(path) and path != reusable:
            path = self.format_checkpoint_name(metrics, filename, ver=version)
            version += 1
        return path

    def _remove_if_ours(self, previous: str, current: str, remove: list[str]) -> None:
        """Delete `previous` only inside our own directory (a path restored from a checkpoint of
        another run must never be deleted), and never the checkpoint this fit resumed from."""
        if previous and previous != current and self.dirpath and Path(self.dirpath) in Path(previous).parents \
                and os.path.realpath(previous) != self._resumed_from:
            remove.append(previous)

    def _monitor_candidates(self, trainer: TrainerContract) -> dict[str, Any]:
        metrics: dict[str, Any] = dict(trainer.callback_metrics)
        for key, default in (("epoch", trainer.current_epoch), ("step", trainer.global_step)):
            value = metrics.get(key)
            metrics[key] = int(value) if isinstance(value, torch.Tensor) else default
        return metrics

    def _missing_message(self, metrics: dict[str, Any]) -> str:
        return (f"ModelCheckpoint(monitor={self.monitor!r}) could not find {self.monitor!r} in the logged metrics; "
                f"available: {sorted(metrics)}. Log it with self.log({self.monitor!r}, value) or change `monitor`.")

    def _resolve_dirpath(self, trainer: TrainerContract) -> str:
        """The given dirpath, else Lightning's default (see `default_dirpath`)."""
        return self.dirpath if self.dirpath is not None else default_dirpath(trainer)


# Real annotation objects on the signature (this module postpones annotations), so tools that build
# command-line parsers from it (jsonargparse, LightningCLI) can read them.
ModelCheckpoint.__init__.__annotations__ = typing.get_type_hints(ModelCheckpoint.__init__)
