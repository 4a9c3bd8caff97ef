"""Code that travels by pickle keeps its file name and, for notebook cells, its source lines, so a
worker's traceback shows the line that failed as Lightning's `ddp_notebook` does.

`cloudpickle` sends by value what a worker cannot import (classes and functions defined in a
notebook cell, in `__main__` or inside a function) and rebuilds their code objects under the
file name "<dynamic-code>" (it does so to make its output deterministic), so a traceback from a
worker reads `File "<dynamic-code>", line 32, in training_step` with no source. This module is a
pickle module for `torch.save(..., pickle_module=cell_sources)`: cloudpickle with one change, each
code object is rebuilt under its real file name. When that file exists only in this process's
`linecache` (IPython registers every cell there, under names like `/tmp/ipykernel_1234/567.py`,
and writes no file), the cell's lines travel with the code and are registered in the worker's
`linecache` as it unpickles, before any traceback could need them. A code object from a real
file needs nothing more: the worker reads the file as the caller would. Ranks forked from the
caller inherit its `linecache` and need none of this.
"""

from __future__ import annotations

import io
import linecache
import os
import pickle
import types
from collections import ChainMap
from collections.abc import Callable
from typing import IO, Any

import cloudpickle

__all__ = ["Pickler", "dump", "dumps", "in_memory_source"]

# What cloudpickle itself does with a code object: a constructor and its arguments (version-dependent).
_CLOUDPICKLE_CODE_REDUCE: Callable[[types.CodeType], tuple[Any, tuple[Any, ...]]] = (
    cloudpickle.Pickler.dispatch_table[types.CodeType])

# linecache's entry for a file it holds in full: (size, mtime, lines, name); mtime None keeps it in the cache.
SourceEntry = tuple[int, Any, list[str], str]


def in_memory_source(filename: str) -> SourceEntry | None:
    """`linecache`'s entry for `filename` when that file exists only in memory (a notebook cell,
    code compiled from a string with its lines registered), else None."""
    entry = linecache.cache.get(filename)
    if entry is None or len(entry) != 4 or os.path.exists(filename):
        return None  # none, a lazy entry (a module's loader reads the file), or a file the worker can read
    return entry  # type: ignore[return-value]


def _reduce_code(code: types.CodeType) -> tuple[Callable[..., types.CodeType], tuple[Any, ...]]:
    constructor, arguments = _CLOUDPICKLE_CODE_REDUCE(code)
    return _rebuild_code, (constructor, arguments, code.co_filename, in_memory_source(code.co_filename))


def _rebuild_code(constructor: Callable[..., types.CodeType], arguments: tuple[Any, ...], filename: str,
                  source: SourceEntry | None) -> types.CodeType:
    """In the worker: register the cell's lines (pickle sends each cell's lines once), then make
    the code object under its real file name."""
    if source is not None:
        linecache.cache[filename] = source
    return constructor(*arguments).replace(co_filename=filename)


class Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, rebuilding code objects under their own file names."""

    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


def dump(obj: Any, file: IO[bytes], protocol: int | None = None) -> None:
    Pickler(file, protocol=protocol).dump(obj)


def dumps(obj: Any, protocol: int | None = None) -> bytes:
    buffer = io.BytesIO()
    dump(obj, buffer, protocol)
    return buffer.getvalue()


# What torch.load may ask of a pickle module: loading is plain pickle (the rebuild functions are importable).
Unpickler, load, loads = pickle.Unpickler, pickle.load, pickle.loads
