"""A rank that exits without raising: the message says where its stderr went (this process's, or a
Jupyter kernel's console or cell) and gives the `if __name__ == "__main__":` advice only where a script
is re-imported (the rank died while starting, and `__main__` is a file)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from strategies.worker_failure import first_failure, in_jupyter_kernel, stderr_whereabouts

GUARD = 'if __name__ == "__main__":'


def _started(failures_dir: Path, rank: int) -> None:
    """What a rank leaves once it runs our code: its fault file (strategies/worker.py)."""
    Path(failures_dir, f"{rank}.fault").write_text("")


@pytest.fixture
def jupyter_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process looks like an ipykernel kernel: `IPython.get_ipython()` returns a shell with a
    kernel, and `__main__` has no file."""
    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    main = types.ModuleType("__main__")  # a kernel's __main__ has no file
    monkeypatch.setitem(sys.modules, "__main__", main)


def _kernel_stderr(monkeypatch: pytest.MonkeyPatch, forwards: bool) -> None:
    """`sys.stderr` is the kernel's stream, forwarding file descriptor 2 to the cell or not (set in the
    test's body: pytest's capture sets its own stream at each phase's start)."""
    stream = types.SimpleNamespace(_should_watch=forwards, write=lambda text: len(text), flush=lambda: None)
    monkeypatch.setattr(sys, "stderr", stream)


def test_a_rank_that_exits_mid_stage_in_a_script_gets_no_main_guard_advice(tmp_path: Path) -> None:
    _started(tmp_path, 1)
    message = str(first_failure({1: 3}, tmp_path))
    assert message.startswith("[rank: 1] worker exited with code 3 in the middle of a stage without raising")
    assert "this process's (above)" in message and GUARD not in message


def test_a_rank_that_dies_while_a_script_is_re_imported_gets_the_main_guard_advice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = types.ModuleType("__main__")
    script.__file__ = str(tmp_path / "train.py")
    monkeypatch.setitem(sys.modules, "__main__", script)
    message = str(first_failure({1: 1}, tmp_path))  # no fault file: it never ran our code
    assert "while it started" in message and GUARD in message and "re-imports the script" in message


def test_without_a_script_file_there_is_nothing_to_re_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # python -c, the REPL
    message = str(first_failure({1: 1}, tmp_path))
    assert "while it started without raising" in message and GUARD not in message


@pytest.mark.usefixtures("jupyter_kernel")
@pytest.mark.parametrize(("forwards", "where"), [
    (True, "forwarded its stderr to this cell's output"),
    (False, "went to the Jupyter kernel's console (the terminal or log of the process running the kernel), not to "
            "this cell"),
])
def test_in_a_kernel_the_message_says_where_stderr_went_and_never_asks_for_a_main_guard(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forwards: bool, where: str) -> None:
    _kernel_stderr(monkeypatch, forwards)
    assert in_jupyter_kernel()
    for started in (False, True):  # dying while starting in a kernel is no re-imported script either
        if started:
            _started(tmp_path, 1)
        message = str(first_failure({1: 3}, tmp_path))
        assert where in message and GUARD not in message


def test_ipykernel_imported_without_a_running_kernel_is_no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    assert not in_jupyter_kernel() and stderr_whereabouts() == "Its stderr is this process's (above)."
