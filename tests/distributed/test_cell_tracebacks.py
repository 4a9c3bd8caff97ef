"""A rank failing in code defined in a notebook cell: the error shows the cell's file name, line and
source line, as Lightning's `ddp_notebook` does (its forked ranks inherit the caller's linecache; ours
get the cell's lines with the work, or inherit them where they are forked)."""

from __future__ import annotations

import linecache
import os
from collections.abc import Iterator
from typing import Any

import pytest

from strategies import DDPStrategy
from strategies.launcher import WorkerFailedError

CELL = f"/tmp/ipykernel_{os.getpid()}/2718281828.py"  # how IPython names a cell; no such file is written
CELL_SOURCE = '''import torch.distributed as dist

def work_in_a_cell(strategy):
    total = strategy.global_rank * 10
    if dist.get_rank() == 1:
        raise ValueError(f"bad batch on rank {dist.get_rank()} ({total})")
    strategy.barrier()  # rank 0 waits for its peer, as in a step's all-reduce
    return total
'''


@pytest.fixture
def cell_function() -> Iterator[Any]:
    """A function defined as IPython defines a cell's: compiled under the cell's name, its lines in
    linecache with no modification time, in a `__main__` namespace no worker can import."""
    linecache.cache[CELL] = (len(CELL_SOURCE), None, CELL_SOURCE.splitlines(keepends=True), CELL)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(CELL_SOURCE, CELL, "exec"), namespace)  # noqa: S102 - the cell
    yield namespace["work_in_a_cell"]
    linecache.cache.pop(CELL, None)


@pytest.mark.timeout(120)
def test_a_failing_rank_shows_the_cells_line(cell_function: Any) -> None:
    strategy = DDPStrategy()
    strategy.configure(accelerator="cpu", devices=2)
    with pytest.raises(WorkerFailedError) as info:
        strategy.launch(cell_function, strategy)
    message = str(info.value)
    assert info.value.rank == 1 and "ValueError: bad batch on rank 1 (10)" in message
    assert f'File "{CELL}", line 6, in work_in_a_cell' in message
    assert 'raise ValueError(f"bad batch on rank {dist.get_rank()} ({total})")' in message
    assert "<dynamic-code>" not in message
