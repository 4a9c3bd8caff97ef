"""Where ModelCheckpoint's files go and what they are called: the directory, Lightning's file
names (`epoch=3-step=120-val_acc=0.970.ckpt`, `last.ckpt`), and the `last` link.

Pure functions of their arguments (and of the file system), so the callback's bookkeeping reads
without them and they are tested without a fit. The join and equals characters are passed in:
ModelCheckpoint reads them from the instance, where a subclass may change them.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import torch

from trainer.checkpoint_choice import checkpoint_candidates
from trainer.contract import TrainerContract


def resolve_last_checkpoint(dirpath: str | os.PathLike[str] | None) -> str | None:
    """The newest `*.ckpt` in `dirpath` (what `fit(ckpt_path="last")` tries first), or None."""
    candidates = checkpoint_candidates(None if dirpath is None else os.fspath(dirpath))
    return candidates[0] if candidates else None


def normalise_dirpath(dirpath: str | os.PathLike[str] | None) -> str | None:
    """A local directory becomes absolute (`~` expanded); a URL (`s3://...`) and "" stay as given."""
    if not dirpath or "://" in str(dirpath):
        return None if dirpath is None else str(dirpath)
    return os.path.realpath(os.path.expanduser(dirpath))


def default_dirpath(trainer: TrainerContract) -> str:
    """Lightning's default: `<save_dir>/<name>/<version>/checkpoints` of the first logger,
    else `<default_root_dir>/checkpoints`."""
    if trainer.loggers:
        logger = trainer.loggers[0]
        save_dir = getattr(logger, "save_dir", None) or trainer.default_root_dir
        version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
        return os.path.join(save_dir, str(logger.name), version, "checkpoints")
    return os.path.join(trainer.default_root_dir, "checkpoints")


def format_filename(template: str | None, metrics: dict[str, Any], prefix: str | None, auto_insert_metric_name: bool,
                    join_char: str, equals_char: str) -> str:
    """The file name for `metrics` (`{epoch}`, `{step}` and logged keys, with format specs), without
    directory and extension; a key that was not logged formats as 0, as in Lightning."""
    filename = template or "{epoch}" + join_char + "{step}"
    values = {key: _plain(value) for key, value in metrics.items()}
    # Longest first, so "{epoch_test" is rewritten before "{epoch" could match inside it.
    for group in sorted(re.findall(r"(\{.*?)[:\}]", filename), key=len, reverse=True):
        name = group[1:]
        if auto_insert_metric_name:
            filename = filename.replace(group, name + equals_char + "{" + name)
        filename = filename.replace(group, f"{{0[{name}]")  # index form: keys may hold dots
        values.setdefault(name, 0)
    filename = filename.format(values)
    return join_char.join((prefix, filename)) if prefix else filename


def find_last_files(dirpath: str | None, last_name: str, extension: str) -> set[str]:
    """The `last` files in dirpath (`last.ckpt`, `last-v1.ckpt`, ...)."""
    if not dirpath or not os.path.isdir(dirpath):
        return set()
    pattern = re.compile(re.escape(last_name) + r"(-v\d+)?" + re.escape(extension) + "$")
    return {os.path.join(dirpath, name) for name in os.listdir(dirpath)
            if pattern.match(name) and os.path.isfile(os.path.join(dirpath, name))}


def replace_with_link(filepath: str, linkpath: str) -> None:
    """Make `linkpath` a relative symlink to `filepath`, atomically (no copy of the weights), replacing
    whatever held that name before (a file, a link, a directory)."""
    temporary = f"{linkpath}.tmp-link"
    if os.path.lexists(temporary):
        os.remove(temporary)
    try:
        os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath) or "."), temporary)
    except OSError:  # no right to make links (Windows without developer mode): a copy instead
        shutil.copy2(filepath, temporary)
    if os.path.isdir(linkpath) and not os.path.islink(linkpath):
        shutil.rmtree(linkpath)
    os.replace(temporary, linkpath)


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
