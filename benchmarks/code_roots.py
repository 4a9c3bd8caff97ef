"""Running contenders against another checkout's `trainer` and `strategies` (before/after runs)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def packages_of(root: Path) -> Iterator[Path]:
    """A directory holding only `root`'s `trainer` and `strategies` (links), to go first on PYTHONPATH.

    Not `root` itself: it has a `benchmarks` package too, which would hide this checkout's contender
    modules. The process must not start in this checkout either: `python -m` puts the working
    directory ahead of PYTHONPATH, so this checkout's packages would win.
    """
    with tempfile.TemporaryDirectory(prefix="bench-code-") as shim:
        for package in ("trainer", "strategies"):
            (Path(shim) / package).symlink_to(Path(root).resolve() / package, target_is_directory=True)
        yield Path(shim)
