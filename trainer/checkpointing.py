"""What a checkpoint holds and how it is put back. Writing and reading is the strategy's job."""

from __future__ import annotations

import hashlib
import os
import warnings
from typing import Any, NamedTuple

import torch

from strategies.checkpoint_io import CheckpointError
from trainer.checkpoint_loops import lightning_loops, position_from_lightning, saved_loader_states
from trainer.compiled import plain_state_dict, state_dict_for
from trainer.hparams import checkpoint_hparams
from trainer.seed import gather_rng_states
from trainer.stage import Stage

FORMAT = "ddp-trainer"
FORMAT_VERSION = 1
OURS_KEY = "ddp_trainer"  # our exact-resume state, inside "loops" (earlier checkpoints: "loops" itself)


def build_checkpoint(parts: Stage, module: Any, weights_only: bool = False) -> dict[str, Any]:
    """Everything needed to resume exactly, in Lightning's layout (its top-level keys, so Lightning
    can load our checkpoints and a callback sees the dict it expects): weights, optimizer and
    scheduler state, callback states, hyperparameters, and the loop position as Lightning's loop
    counters under "loops". What Lightning lacks and exact resumption needs (every rank's RNG
    state, metric state, our own loop position) lives in "loops" too, under OURS_KEY, so the
    top-level keys are exactly Lightning's and Lightning's loader (which reads its own loops'
    entries) passes it by. Its RNG states are stored as float64 tensors (exact: every value is
    below 2**53), so tools that compare two checkpoints' loops numerically can."""
    progress, strategy = parts.progress, parts.strategy
    ours = {**progress.state_dict(), "format": FORMAT, "format_version": FORMAT_VERSION}
    ours.pop("stage_counts")  # validate/test/predict counts belong to this Trainer, not to the fit resumed
    ours["run"] = run_identity(module)  # a fit resuming automatically checks it is the same run
    mark = parts.fit_run.preemption_mark
    if mark:
        ours["preemption"] = dict(mark)  # which signal; written at the agreed step boundary
    checkpoint: dict[str, Any] = {
        "epoch": progress.current_epoch,
        "global_step": progress.global_step,
        "pytorch-lightning_version": lightning_version(module),
        "state_dict": plain_state_dict(module.state_dict()),
        "loops": {**lightning_loops(parts), OURS_KEY: ours},
    }
    _add_hparams(checkpoint, module, "hyper_parameters", "hparams_name")
    datamodule = parts.datamodule
    if datamodule is not None:
        _add_hparams(checkpoint, datamodule, "datamodule_hyper_parameters", "datamodule_hparams_name")
    if not weights_only:
        checkpoint["callbacks"] = parts.callbacks.state_dict()
        # a sharded optimizer's state is gathered here (a collective)
        optimizers = parts.attached.optimizers
        checkpoint["optimizer_states"] = [strategy.optimizer_state_dict(optimizer) for optimizer in optimizers]
        checkpoint["lr_schedulers"] = [config.scheduler.state_dict() for config in parts.attached.lr_scheduler_configs]
        ours["metrics"] = parts.metrics.state_dict()
        ours["strategy"] = strategy.state_dict()  # e.g. the bucket cap "auto" settled on
        ours["rng_states"] = _rng_as(torch.float64, gather_rng_states(strategy.all_gather_ranks,
                                                                      strategy.root_device.type))
        precision = parts.precision.state_dict()
        if precision:
            checkpoint[_PRECISION_KEY] = precision
        if datamodule is not None and callable(getattr(datamodule, "state_dict", None)):
            state = datamodule.state_dict()
            if state:
                checkpoint[type(datamodule).__qualname__] = state
    parts.callbacks.call("on_save_checkpoint", parts.trainer, module, checkpoint)
    return checkpoint


def _add_hparams(checkpoint: dict[str, Any], owner: Any, key: str, name_key: str) -> None:
    """Lightning's keys for a module's (or datamodule's) hyperparameters (`checkpoint_hparams`), and the
    name of the `__init__` argument they came in as when that was one object (`hparams`), so
    `load_from_checkpoint` passes them back the same way."""
    hparams = checkpoint_hparams(getattr(owner, "hparams", None))
    if not hparams:
        return
    checkpoint[key] = hparams
    name = getattr(owner, "_hparams_name", None)
    if name:
        checkpoint[name_key] = name


_PRECISION_KEY = "MixedPrecision"  # Lightning stores its GradScaler under its plugin's class name


def lightning_version(module: Any) -> str:
    """The version of the Lightning package the module comes from (Lightning's loader reads this key
    to migrate old checkpoints); for our own modules the installed Lightning's, else ours."""
    from importlib import metadata

    package = "lightning" if type(module).__module__.startswith("lightning") or any(
        cls.__module__.startswith("lightning.") for cls in type(module).__mro__) else "pytorch-lightning"
    for name in (package, "pytorch-lightning", "lightning"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "0.0.0+ddp-trainer"


def _ours(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Our section: loops[OURS_KEY] now; earlier checkpoints kept it at the top level or as "loops"."""
    loops = checkpoint.get("loops")
    for section in (loops.get(OURS_KEY) if isinstance(loops, dict) else None, checkpoint.get(OURS_KEY)):
        if isinstance(section, dict):
            return section
    return loops if isinstance(loops, dict) and "fit_loop" not in loops else {}


def _saved(checkpoint: dict[str, Any], key: str, default: Any) -> Any:
    """A value of ours (at the top level in the oldest checkpoints)."""
    section = _ours(checkpoint)
    return section[key] if key in section else checkpoint.get(key, default)


def run_identity(module: Any) -> str:
    """Which run a checkpoint belongs to: the module's class and a digest of its hyperparameters (a fit
    that finds a checkpoint by itself resumes only its own run's, not a sweep neighbour's)."""
    module = getattr(module, "_orig_mod", module)
    cls = type(module)
    hparams = repr(sorted(checkpoint_hparams(getattr(module, "hparams", None)).items()))
    return f"{cls.__module__}.{cls.__qualname__}:{hashlib.sha1(hparams.encode()).hexdigest()[:12]}"


def same_run(module: Any, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> bool:
    """Whether an automatically found checkpoint is this run's; warns when not."""
    saved, mine = _ours(checkpoint).get("run"), run_identity(module)
    if saved in (None, mine):
        return True
    warnings.warn(f"{path} was written by another run ({saved}; this one is {mine}: another model or other "
                  "hyperparameters), so this fit starts from scratch and leaves it alone. Pass ckpt_path to "
                  "resume from it anyway, or use another default_root_dir per run.", stacklevel=2)
    return False


def _rng_as(dtype: torch.dtype, states: Any) -> Any:
    """RNG state tensors in `dtype` (float64 in the file, int64 for restoring)."""
    if not isinstance(states, dict):
        return states
    return {key: value.to(dtype) if isinstance(value, torch.Tensor) else value for key, value in states.items()}


def _loop_position(checkpoint: dict[str, Any], accumulate_grad_batches: int) -> dict[str, Any]:
    """Our loop position; from Lightning's loop counters when Lightning wrote the checkpoint."""
    ours = _ours(checkpoint)
    if ours:
        return ours
    loops = checkpoint.get("loops", {})
    if not isinstance(loops, dict) or "fit_loop" not in loops:
        return {}
    return position_from_lightning(loops, checkpoint, accumulate_grad_batches)


def check_checkpoint(checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """A checkpoint of another framework or format fails here with the file's name."""
    if "state_dict" not in checkpoint:
        raise CheckpointError(f"{path!r} is not a ddp-trainer checkpoint: it has no 'state_dict' "
                              f"(keys: {sorted(checkpoint)[:10]}).")
    version = _saved(checkpoint, "format_version", FORMAT_VERSION)
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path!r} was written by a newer ddp-trainer (format {version} > {FORMAT_VERSION}).")


def restore_module(module: Any, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
    try:
        # Lightning's `module.strict_loading` (ours and Lightning's answer a bool) lets a module load a partial state
        module.load_state_dict(state_dict_for(module, checkpoint["state_dict"]),
                               strict=bool(getattr(module, "strict_loading", True)))
    except RuntimeError as error:
        mismatch = describe_mismatch(module.state_dict(), checkpoint["state_dict"])
        raise CheckpointError(f"{path!r} does not fit {type(module).__name__} (a checkpoint of another model?): "
                              f"{mismatch}") from error


def describe_mismatch(expected: dict[str, Any], found: dict[str, Any], shown: int = 3) -> str:
    """One line: which keys are missing, unexpected or of another shape (the first few of each)."""
    def listing(label: str, keys: list[str]) -> str:
        more = f", ... ({len(keys)} in all)" if len(keys) > shown else ""
        return f"{label} {', '.join(keys[:shown])}{more}"

    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    reshaped = [f"{key} {tuple(found[key].shape)} vs {tuple(value.shape)}" for key, value in expected.items()
                if key in found and hasattr(value, "shape") and tuple(found[key].shape) != tuple(value.shape)]
    parts = [listing(label, keys) for label, keys in
             (("missing:", missing), ("unexpected:", unexpected), ("other shape:", reshaped)) if keys]
    return "; ".join(parts) or "the state_dict does not load"


def restore_callbacks(parts: Stage, module: Any, checkpoint: dict[str, Any]) -> None:
    """Right after the weights, before `configure_optimizers` (Lightning's order): the module's
    `on_load_checkpoint`, then each callback's, then the callbacks' saved states."""
    callbacks = parts.callbacks
    callbacks.call_module("on_load_checkpoint", module, checkpoint)
    callbacks.call_callbacks("on_load_checkpoint", parts.trainer, module, checkpoint)
    callbacks.load_state_dict(checkpoint.get("callbacks", {}))


class SavedPosition(NamedTuple):
    """What the fit's first epoch still has to put back after `restore_training_state`: the training loaders'
    positions and every rank's RNG, at the point the checkpoint was taken (trainer/loops/resume.py)."""

    loader_states: list[dict[str, Any]]
    rng_states: dict[str, Any] | None


def restore_training_state(parts: Stage, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> SavedPosition:
    """Optimizers, schedulers, scaler and the loop's progress; returns the rest of the saved position."""
    optimizer_states = checkpoint.get("optimizer_states")
    if optimizer_states is None:
        raise CheckpointError(f"{path!r} holds weights only (save_weights_only=True); it cannot resume training. "
                              "Load it with LightningModule.load_from_checkpoint instead.")
    optimizers = parts.attached.optimizers
    if len(optimizer_states) != len(optimizers):
        raise CheckpointError(f"{path!r} holds {len(optimizer_states)} optimizer state(s) but "
                              f"configure_optimizers() returned {len(optimizers)}.")
    for optimizer, state in zip(optimizers, optimizer_states):
        optimizer.load_state_dict(state)
    for config, state in zip(parts.attached.lr_scheduler_configs, checkpoint.get("lr_schedulers", [])):
        config.scheduler.load_state_dict(state)
    parts.precision.load_state_dict(checkpoint.get(_PRECISION_KEY, checkpoint.get("precision", {})))
    parts.metrics.load_state_dict(_saved(checkpoint, "metrics", {}))
    parts.strategy.load_state_dict(_saved(checkpoint, "strategy", {}))
    parts.progress.load_state_dict(_loop_position(checkpoint, parts.live.accumulate_grad_batches))
    _check_not_past_max_epochs(parts, path)
    return SavedPosition(saved_loader_states(checkpoint), _rng_as(torch.int64, _saved(checkpoint, "rng_states", None)))


def restore_datamodule(parts: Stage, checkpoint: dict[str, Any]) -> None:
    """The datamodule's own state (its `load_state_dict`), restored with the module and callbacks."""
    datamodule = parts.datamodule
    if datamodule is not None and callable(getattr(datamodule, "load_state_dict", None)):
        state = checkpoint.get(type(datamodule).__qualname__, checkpoint.get("datamodule"))
        if state:
            datamodule.load_state_dict(state)


def _check_not_past_max_epochs(parts: Stage, path: str | os.PathLike[str]) -> None:
    """Resuming past the last epoch would silently train nothing (Lightning raises too)."""
    max_epochs, epoch = parts.live.max_epochs, parts.progress.current_epoch
    if max_epochs is not None and max_epochs != -1 and epoch > max_epochs:
        raise CheckpointError(f"{path!r} was written in epoch {epoch}, past "
                              f"Trainer(max_epochs={max_epochs}): raise max_epochs to train on, or load only the "
                              "weights (LightningModule.load_from_checkpoint).")


def require_checkpoint_file(ckpt_path: str | os.PathLike[str] | None, keywords: tuple[str, ...] = ("best", "last")) -> None:
    """The one check that a `ckpt_path` names a checkpoint: None or a keyword the caller resolves later,
    else an existing file. Run before any worker starts, so a typo costs nothing."""
    if ckpt_path is None or ckpt_path in keywords:
        return
    if not os.path.isfile(ckpt_path):
        allowed = ", ".join(repr(keyword) for keyword in keywords)
        raise CheckpointError(f"ckpt_path={os.fspath(ckpt_path)!r} does not exist; pass a checkpoint file, {allowed} "
                              "or None.")
