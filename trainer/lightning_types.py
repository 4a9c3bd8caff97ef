"""Lightning's classes, recognised by type, without ever importing Lightning.

An object can only be an instance of one of Lightning's classes if Lightning is already imported, so
the class is looked up among the modules already loaded (both of Lightning's package names). A
user's own class that happens to share a name with Lightning's (`EarlyStopping`) is then never
taken for Lightning's, and a process that never imported Lightning pays one dictionary lookup.
"""

from __future__ import annotations

import sys

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def lightning_classes(path: str) -> tuple[type, ...]:
    """Lightning's class at `path` (relative to the package, e.g. "callbacks.EarlyStopping" or
    "LightningDataModule") in each Lightning package this process has imported."""
    module_path, _, name = path.rpartition(".")
    found = []
    for package in _PACKAGES:
        module = sys.modules.get(f"{package}.{module_path}" if module_path else package)
        cls = getattr(module, name, None) if module is not None else None
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def is_lightning_instance(obj: object, path: str) -> bool:
    """True when `obj` is an instance of Lightning's class at `path` (see `lightning_classes`)."""
    classes = lightning_classes(path)
    return bool(classes) and isinstance(obj, classes)
