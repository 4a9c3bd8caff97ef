"""Make a package look uninstalled in this process, to show a program runs without it.

`hide_packages("pytorch_lightning")` wraps the path finder on `sys.meta_path` so that the package and its
submodules are not found: `import pytorch_lightning` raises ModuleNotFoundError and
`importlib.util.find_spec("pytorch_lightning")` is None and importlib.metadata finds no such distribution, as on a machine where it was never installed.
Call it before anything imports the package.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Iterator, Sequence
from typing import Any


class _HidingPathFinder:
    """The path finder, blind to the hidden top-level names."""

    def __init__(self, hidden: set[str]) -> None:
        self.hidden = hidden

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        if name.partition(".")[0] in self.hidden:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    def find_distributions(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """Installed distributions (importlib.metadata asks here), less those of the hidden packages."""
        for distribution in importlib.machinery.PathFinder.find_distributions(*args, **kwargs):
            name = (distribution.metadata["Name"] or "").lower().replace("-", "_")
            if name not in self.hidden:
                yield distribution

    def invalidate_caches(self) -> None:
        importlib.machinery.PathFinder.invalidate_caches()


def hide_packages(names: str) -> None:
    """Hide the comma-separated top-level package `names` (an empty string hides nothing)."""
    hidden = {name.strip() for name in names.split(",") if name.strip()}
    if not hidden:
        return
    loaded = sorted(name for name in sys.modules if name.partition(".")[0] in hidden)
    if loaded:
        raise RuntimeError(f"hide_packages({names!r}) came too late: {loaded[:3]} already imported.")
    sys.meta_path[:] = [_HidingPathFinder(hidden) if finder is importlib.machinery.PathFinder else finder
                        for finder in sys.meta_path]
