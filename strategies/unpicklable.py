"""Name every object in a stage's work that cannot be pickled, each with the path that reaches it.

Used only after pickling the work already failed, to turn one bare `TypeError: cannot pickle 'lock'
object` into "datamodule.guard (lock), callbacks[0].g (generator), model.sock (socket)". The walk
must never fail itself, whatever the user's objects do: a `__getstate__` that raises (a socket's),
a property that loops, a cycle, a huge list. So every step catches everything, the walk is breadth
first (the shortest path to an object names it, each object once), and its depth, its breadth per
object and its total size are bounded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import cloudpickle

_MOST_DEPTH = 8  # attribute hops from an argument
_MOST_PARTS = 200  # items or attributes looked at per object
_MOST_VISITS = 4000  # objects pickled in all: the diagnosis stays well under a second for small work
_MOST_NAMED = 20  # culprits listed (more would drown the message)


def unpicklable_paths(named: dict[str, Any]) -> list[str]:
    """Every innermost part of `named`'s values that cannot be pickled, as "path (type)", shortest
    path first. A part counts when it fails to pickle and none of its own parts explains why (a lock,
    a generator, a socket), so a module holding a lock is named by its lock, not as a whole."""
    found: list[str] = []
    seen: set[int] = set()
    queue: deque[tuple[str, Any, int]] = deque((label, value, 0) for label, value in named.items())
    visits = 0
    while queue and visits < _MOST_VISITS and len(found) < _MOST_NAMED:
        path, value, depth = queue.popleft()
        if id(value) in seen:
            continue
        seen.add(id(value))
        visits += 1
        failure = pickling_failure(value)
        if failure is None:
            continue
        parts = list(_parts(value)) if depth < _MOST_DEPTH else []
        failing = [(f"{path}{step}", part) for step, part in parts if id(part) not in seen]
        if not any(pickling_failure(part) is not None for _, part in failing):
            found.append(f"{path} ({_type_name(value)})")
            continue
        queue.extend((part_path, part, depth + 1) for part_path, part in failing)
    return found


def pickling_failure(value: Any) -> BaseException | None:
    """Why `value` cannot be pickled by cloudpickle, or None when it can."""
    try:
        cloudpickle.dumps(value)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: BLE001 - any failure means: this part cannot travel
        return error
    return None


def _parts(value: Any) -> Iterator[tuple[str, Any]]:
    """What `value` pickles, as (path step, part): its items, or its state (`__getstate__`, else
    `__dict__` and `__slots__`). Nothing when asking raises."""
    try:
        yield from _bounded(_raw_parts(value))
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - a part we cannot look into is named as a whole
        return


def _bounded(parts: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    for count, part in enumerate(parts):
        if count >= _MOST_PARTS:
            return
        yield part


def _raw_parts(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        yield from ((f"[{key!r}]", item) for key, item in value.items())
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        yield from ((f"[{index}]", item) for index, item in enumerate(value))
        return
    state = _state(value)
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):  # (dict, slots)
        state = {**(state[0] or {}), **state[1]}
    if isinstance(state, dict):
        yield from ((f".{key}", item) for key, item in state.items())


def _state(value: Any) -> Any:
    """The object's pickled state: its own `__getstate__` (which may raise: the caller catches it),
    else its `__dict__`."""
    getstate = getattr(value, "__getstate__", None)
    if getstate is not None:
        try:
            return getstate()
        except TypeError:
            pass  # a socket's or a file's: "cannot pickle"; its attributes may still say more
    return getattr(value, "__dict__", None)


def _type_name(value: Any) -> str:
    try:
        return type(value).__name__
    except BaseException:  # noqa: BLE001
        return "object"
