"""The diagnosis of work that cannot be pickled names every culprit with its path, and never fails
itself, whatever the objects do."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import launcher
from strategies.ddp import DDPStrategy
from strategies.unpicklable import unpicklable_paths


class Holder:
    def __init__(self, **parts: Any) -> None:
        self.__dict__.update(parts)


class RaisingState:
    """An object whose __getstate__ raises something other than TypeError, and whose reduce fails too."""

    def __getstate__(self) -> Any:
        raise RuntimeError("my state is secret")


class LoopingProperty:
    @property
    def __dict__(self) -> Any:  # type: ignore[override]
        raise RecursionError("no")

    def __reduce__(self) -> Any:
        raise ValueError("cannot reduce")


def _work(trainer: Any, model: Any, data: Any) -> None:
    pass


def test_every_object_is_named_with_its_path() -> None:
    with socket.socket() as sock:
        model = Holder(sock=sock, weight=torch.ones(2))
        datamodule = Holder(guard=threading.Lock(), size=3)
        callback = Holder(g=(i for i in range(3)))
        found = unpicklable_paths({"model": model, "datamodule": datamodule, "callbacks": [callback]})
    assert found == ["model.sock (socket)", "datamodule.guard (lock)", "callbacks[0].g (generator)"]


def test_the_walk_survives_cycles_raising_state_and_huge_containers() -> None:
    cyclic = Holder(lock=threading.RLock())
    cyclic.me = cyclic
    huge = list(range(100_000)) + [threading.Lock()]  # beyond the breadth bound: named as a whole list
    deep: Any = threading.Lock()
    for _ in range(50):
        deep = Holder(inner=deep)
    found = unpicklable_paths({"cyclic": cyclic, "secret": RaisingState(), "odd": LoopingProperty(),
                               "huge": huge, "deep": deep})
    assert "cyclic.lock (RLock)" in found and "secret (RaisingState)" in found and "odd (LoopingProperty)" in found
    assert "huge (list)" in found
    assert any(path.startswith("deep.inner.inner") for path in found)


def test_the_launch_error_names_all_culprits_and_why_ranks_were_not_forked(tmp_path: Path) -> None:
    with socket.socket() as sock:
        args = (Holder(guard=threading.Lock()), Holder(sock=sock), {"datamodule": Holder(g=(i for i in range(2)))})
        with pytest.raises(TypeError) as raised:
            launcher._serialize(DDPStrategy(), _work, args, {}, tmp_path / "payload.pt",
                                why_not_forked="this platform has no fork")
    message = str(raised.value)
    for path in ("trainer.guard (lock)", "model.sock (socket)", "data['datamodule'].g (generator)"):
        assert path in message
    assert "not forked from this process because this platform has no fork" in message
