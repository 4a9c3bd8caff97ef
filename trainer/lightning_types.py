"""Lightning's classes, recognised by type, without ever importing Lightning.

The rule lives in strategies/lightning_types.py (the strategies need it too): a class is Lightning's
when its MRO holds a class of that name defined inside `lightning.pytorch` or `pytorch_lightning`,
so both packages are accepted alike, a process that never imported Lightning pays a walk of one MRO,
and a user's class that shares a name with Lightning's (`EarlyStopping`) is never taken for it.
"""

from __future__ import annotations

from strategies.lightning_types import derives_from, is_instance, loaded_packages, package_of

__all__ = ["derives_from", "is_lightning_instance", "loaded_packages", "package_of"]


def is_lightning_instance(obj: object, path: str) -> bool:
    """True when `obj` is an instance of Lightning's class at `path`, relative to either package
    ("callbacks.Callback", "LightningDataModule", ...)."""
    return is_instance(obj, path)
