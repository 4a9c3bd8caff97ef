"""Lightning's classes recognised without importing Lightning, and our strategies made Lightning's types.

Both of Lightning's package names are served alike: `lightning.pytorch` (the unified package, what
Lightning's docs import) and `pytorch_lightning`. A class is Lightning's when a class in its MRO is
defined inside one of those packages under the expected name: no lookup through Lightning's public
modules (which a program, or a test harness, may have patched), and a user's own class that merely
shares a name (`EarlyStopping`) is never taken for Lightning's.

`register_strategy_types()` makes `isinstance(trainer.strategy, lightning.pytorch.strategies.ParallelStrategy)`
(and `Strategy`, `DDPStrategy`, `SingleDeviceStrategy`, from either package) answer as for the Lightning
strategy ours stands for. Lightning's strategy classes are ABCs, so ours are registered as virtual
subclasses: only for packages this process has already imported (nothing here imports Lightning),
once per package. The Trainer calls it when it is built and when each stage starts, on every rank.
"""

from __future__ import annotations

import sys

PACKAGES = ("lightning.pytorch", "pytorch_lightning")
_registered: set[str] = set()


def loaded_packages() -> tuple[str, ...]:
    """The Lightning packages this process has imported, `lightning.pytorch` first."""
    return tuple(package for package in PACKAGES if sys.modules.get(package) is not None)


def package_of(cls: type) -> str | None:
    """The Lightning package `cls` derives from (its first class defined in one), else None."""
    for base in getattr(cls, "__mro__", ()):
        package = _defining_package(base)
        if package is not None:
            return package
    return None


def derives_from(cls: type, path: str) -> bool:
    """True when `cls` derives from Lightning's class at `path` (relative to either package, e.g.
    "callbacks.Callback", "LightningDataModule", "utilities.CombinedLoader")."""
    module_path, _, name = path.rpartition(".")
    for base in getattr(cls, "__mro__", ()):
        package = _defining_package(base)
        if package is None or base.__name__ != name:
            continue
        inside = base.__module__[len(package):].lstrip(".")
        if not module_path or inside == module_path or inside.startswith(module_path + "."):
            return True
    return False


def is_instance(obj: object, path: str) -> bool:
    """True when `obj` is an instance of Lightning's class at `path` (see `derives_from`)."""
    return derives_from(type(obj), path)


def _defining_package(cls: type) -> str | None:
    module = getattr(cls, "__module__", None) or ""
    for package in PACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    return None


def register_strategy_types() -> None:
    """Register our strategies with the strategy ABCs of every Lightning package imported so far."""
    for package in loaded_packages():
        if package in _registered:
            continue
        strategies = sys.modules.get(f"{package}.strategies")
        if strategies is None:  # the package is still being imported; a later call registers
            continue
        from strategies.base import Strategy
        from strategies.ddp import DDPStrategy
        from strategies.single_device import SingleDeviceStrategy

        strategies.Strategy.register(Strategy)
        strategies.SingleDeviceStrategy.register(SingleDeviceStrategy)
        strategies.DDPStrategy.register(DDPStrategy)  # hence also a ParallelStrategy
        _registered.add(package)
