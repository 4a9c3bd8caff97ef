"""Which checkpoint a stage starts from: the one home for that choice, for every stage and every path.

The caller's side (`requested_checkpoint`, before any worker starts) checks what was asked and applies
Lightning's default after a fit (evaluating without a model uses the best checkpoint). Every rank then
calls `choose_checkpoint` as its stage sets up:

* a file: that file; `"best"`: the checkpoint callback's best file (an error when none is known);
* `"last"`: the newest readable `*.ckpt` in the checkpoint callbacks' directories (fit also counts the
  preemption checkpoint; fit skips an unreadable file with a warning, other stages fail on it);
* no `ckpt_path` in fit: the newest checkpoint of this run when `<default_root_dir>/preempted.ckpt`
  exists (trainer/loops/preemption.py writes it), else the newest one after an elastic restart, else none.

Loading itself is the strategy's (`Strategy.load_checkpoint`); restoring is `checkpointing.py`'s.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strategies.checkpoint_io import CheckpointError, UntrustedCheckpointError
from strategies.rank_zero import rank_zero_info, rank_zero_warn
from trainer.checkpointing import check_checkpoint, require_checkpoint_file, same_run
from trainer.contract import TrainerContract

PREEMPTION_CHECKPOINT = "preempted.ckpt"


@dataclass(frozen=True)
class CheckpointRequest:
    """The checkpoint a stage was asked to start from (`path`: a file, "last", "best" or None) and
    whether its file may only hold weights and plain values (`weights_only=False`: the user trusts it)."""

    path: str | os.PathLike[str] | None = None
    weights_only: bool = True


@dataclass(frozen=True)
class ChosenCheckpoint:
    """What `choose_checkpoint` settled on: the file (None: start without one) and its loaded contents.
    `resumes_preempted_run`: a fit found the preemption checkpoint by itself, to be removed once it completes."""

    path: str | os.PathLike[str] | None = None  # as given (Lightning keeps a Path a Path)
    contents: dict[str, Any] | None = None
    resumes_preempted_run: bool = False


def requested_checkpoint(trainer: TrainerContract, stage: str, *, model_given: bool, fitted: bool,
                         ckpt_path: str | os.PathLike[str] | None, weights_only: bool | None) -> CheckpointRequest:
    """The request, checked in the calling process before any worker starts (a typo costs nothing).
    Lightning's rule: after a fit, evaluating without a model and without `ckpt_path` uses the best
    checkpoint of that fit; say so, since the weights are not the ones the fit ended with."""
    if weights_only not in (None, True, False):
        raise TypeError(f"weights_only={weights_only!r} must be None, True or False.")
    require_checkpoint_file(ckpt_path)
    path = ckpt_path
    best = getattr(trainer.checkpoint_callback, "best_model_path", None)
    if stage != "fit" and path is None and not model_given and fitted and best:
        rank_zero_warn(f"{stage}() was called without a model after fit(): it uses the best checkpoint of that fit "
                       f"({best}), not the weights the fit ended with. Pass ckpt_path='best', 'last', a file, or the "
                       "model itself to choose (and silence this).")
        path = "best"
    return CheckpointRequest(path, weights_only=weights_only is not False)


def choose_checkpoint(trainer: TrainerContract, stage: str, module: Any,
                      request: CheckpointRequest) -> ChosenCheckpoint:
    """The checkpoint `stage` starts from, loaded (see the module docstring for the rule of each request)."""
    path = request.path
    automatic = stage == "fit" and path is None and _preemption_checkpoint_found(trainer)
    if automatic:
        path = "last"
    elif stage == "fit" and path is None and trainer.strategy.restart_count > 0:
        path = "last"  # an elastic restart resumes from the newest checkpoint by itself
    if path is None:
        return ChosenCheckpoint()
    also = [preemption_checkpoint_path(trainer)] if stage == "fit" else []
    candidates = _files(_best_path(trainer) if path == "best" else path, _checkpoint_dirs(trainer), also)
    for candidate in candidates:
        try:
            contents = _load(trainer, candidate, request.weights_only)
        except CheckpointError as error:
            if path != "last" or stage != "fit" or isinstance(error, UntrustedCheckpointError):
                raise
            warnings.warn(f"ckpt_path='last': skipping unreadable {candidate}: {error}", stacklevel=2)
            continue
        if automatic and not same_run(trainer.strategy.unwrap(module), contents, candidate):
            return ChosenCheckpoint()
        return ChosenCheckpoint(candidate, contents, resumes_preempted_run=automatic)
    if path == "last" and stage == "fit":
        warnings.warn(f"ckpt_path='last' found no readable checkpoint in {_checkpoint_dirs(trainer)}; training "
                      "starts from scratch.", stacklevel=2)
    return ChosenCheckpoint(resumes_preempted_run=automatic)


def preemption_checkpoint_path(trainer: TrainerContract) -> str:
    """Where a preempted fit leaves its checkpoint: the root directory, not a logger's version folder,
    so a requeued run finds it."""
    return os.path.join(str(trainer.default_root_dir), PREEMPTION_CHECKPOINT)


def discard_preemption_checkpoint(trainer: TrainerContract) -> None:
    """After a fit that completed a preempted run: remove its preemption checkpoint, so that a later fit
    in the same directory does not resume a finished run."""
    trainer.strategy.remove_checkpoint(preemption_checkpoint_path(trainer))


def checkpoint_candidates(dirpath: str | None) -> list[str]:
    """`*.ckpt` files in `dirpath`, newest first (a `last*.ckpt` wins a tie: it is written right
    after the top-k file of the same step)."""
    if dirpath is None or not Path(dirpath).is_dir():
        return []
    files = [path for path in Path(dirpath).glob("*.ckpt") if path.is_file()]
    files.sort(key=lambda path: (path.stat().st_mtime_ns, path.name.startswith("last")), reverse=True)
    return [str(path) for path in files]


def _preemption_checkpoint_found(trainer: TrainerContract) -> bool:
    """A fit without `ckpt_path`, in a directory holding a preemption checkpoint: it resumes from the newest
    of it and the checkpoints written since (a resumed run that later crashed must not rewind)."""
    path = preemption_checkpoint_path(trainer)
    if not os.path.isfile(path):
        return False
    rank_zero_info(f"Found the preemption checkpoint {path}: resuming from it or a newer checkpoint of this run "
                   "(pass ckpt_path to start from another); it is removed once this fit completes.")
    return True


def _files(ckpt_path: str | os.PathLike[str], checkpoint_dirs: list[str],
           also: list[str]) -> list[str | os.PathLike[str]]:
    """The files to try, in order: `"last"` -> every checkpoint in the checkpoint directories and
    the existing files of `also` (the preemption checkpoint), newest first (an unreadable one is
    skipped by the caller); a path -> that file."""
    if ckpt_path != "last":
        require_checkpoint_file(ckpt_path)
        return [ckpt_path]
    candidates: list[str | os.PathLike[str]] = [
        path for directory in checkpoint_dirs for path in checkpoint_candidates(directory)]
    candidates += [path for path in also if Path(path).is_file() and path not in candidates]
    return sorted(candidates, key=lambda path: Path(path).stat().st_mtime_ns, reverse=True)


def _checkpoint_dirs(trainer: TrainerContract) -> list[str]:
    dirs = [getattr(callback, "dirpath", None) or os.path.join(str(trainer.log_dir), "checkpoints")
            for callback in trainer.checkpoint_callbacks]
    return [directory for directory in dirs if directory]


def _best_path(trainer: TrainerContract) -> str:
    path = getattr(trainer.checkpoint_callback, "best_model_path", None) or None
    if not path:
        raise CheckpointError("ckpt_path='best' but no best checkpoint is known: fit with a ModelCheckpoint first "
                              "(with a `monitor`, or it keeps the last one), or pass a checkpoint file.")
    return path


def _load(trainer: TrainerContract, path: str | os.PathLike[str], weights_only: bool) -> dict[str, Any]:
    checkpoint = trainer.strategy.load_checkpoint(path, weights_only=weights_only)
    check_checkpoint(checkpoint, path)
    return checkpoint
