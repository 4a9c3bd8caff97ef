"""Code defined in a notebook cell keeps its file name and source lines when it travels by pickle to
another process: that process's traceback shows the cell's line (plain cloudpickle shows
`File "<dynamic-code>"` and no source)."""

from __future__ import annotations

import linecache
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

from strategies import cell_sources

CELL = "/tmp/ipykernel_4242/1234567890.py"  # how IPython names a cell; no such file exists
CELL_SOURCE = '''import math

class Model:
    def training_step(self, batch):
        scale = 2
        raise ValueError("a bug in the cell, line 7")
'''
_REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def cell_class(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A class defined as IPython defines a cell's: compiled under the cell's name, its lines in
    linecache with no modification time, in a `__main__` namespace that no other process can import."""
    assert not os.path.exists(CELL)
    lines = CELL_SOURCE.splitlines(keepends=True)
    monkeypatch.setitem(linecache.cache, CELL, (len(CELL_SOURCE), None, lines, CELL))
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(CELL_SOURCE, CELL, "exec"), namespace)  # noqa: S102 - the cell
    return namespace["Model"]


def _traceback_in_another_process(path: Path, load_with_torch: bool) -> str:
    """Load the pickled model in a fresh interpreter, call the failing method, return its traceback as
    the `traceback` module formats it (as a worker stamps its failure; it reads lines from linecache)."""
    load = "torch.load(path, weights_only=False)" if load_with_torch else "pickle.load(open(path, 'rb'))"
    program = (f"import pickle, sys, traceback{', torch' if load_with_torch else ''}\npath = sys.argv[1]\nmodel = {load}\ntry:\n"
               f"    model.training_step(None)\nexcept ValueError:\n    sys.exit(traceback.format_exc())\n")
    run = subprocess.run([sys.executable, "-c", program, str(path)], capture_output=True, text=True, timeout=120,
                         cwd=_REPO, env=dict(os.environ, PYTHONPATH=str(_REPO)))
    assert run.returncode == 1, run.stderr
    return run.stderr


@pytest.mark.timeout(180)
def test_a_cells_code_keeps_its_name_and_lines_in_another_process(cell_class: Any, tmp_path: Path) -> None:
    path = tmp_path / "work.pt"
    torch.save(cell_class(), path, pickle_module=cell_sources)  # as the launcher sends a stage's work
    text = _traceback_in_another_process(path, load_with_torch=True)
    assert f'File "{CELL}", line 6, in training_step' in text
    assert 'raise ValueError("a bug in the cell, line 7")' in text and "<dynamic-code>" not in text


@pytest.mark.timeout(180)
def test_plain_cloudpickle_loses_the_cell(cell_class: Any, tmp_path: Path) -> None:
    """What the launcher sent before: the failure this module exists for."""
    path = tmp_path / "work.pkl"
    path.write_bytes(cloudpickle.dumps(cell_class()))
    text = _traceback_in_another_process(path, load_with_torch=False)
    assert 'File "<dynamic-code>", line 6, in training_step' in text and "raise ValueError(" not in text


def test_code_from_a_real_file_sends_no_lines(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("def step():\n    return 1\n")
    linecache.getline(str(script), 1)  # in the cache now, read from the file
    try:
        assert cell_sources.in_memory_source(str(script)) is None  # the worker reads the file itself
    finally:
        linecache.cache.pop(str(script), None)


def test_a_cells_nested_functions_keep_the_cell(cell_class: Any) -> None:
    """Code inside code (a function defined in a method) is rebuilt under the cell's name too."""
    def outer() -> Any:
        def inner() -> int:
            return 1
        return inner
    rebuilt = cloudpickle.loads(cell_sources.dumps(outer))
    assert rebuilt.__code__.co_filename == __file__ and rebuilt().__code__.co_filename == __file__
    method = cloudpickle.loads(cell_sources.dumps(cell_class)).training_step
    assert method.__code__.co_filename == CELL
