"""The `conformance` marker: slow differential runs (2 processes, the long tail of the corpus).

They are skipped unless selected, so `make test` stays within its time budget on 2 cores:
`pytest -m conformance tests/conformance` (or `DDP_CONFORMANCE=1 pytest tests/conformance`) runs them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch


SLOW_FOLDERS = ("/tests/conformance/", "/tests/notebook/")  # tests/notebook/conftest.py takes these hooks too


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: slow differential run against Lightning (skipped unless "
                                       "selected with -m conformance or DDP_CONFORMANCE=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = "conformance" in (config.getoption("markexpr", "") or "") or os.environ.get("DDP_CONFORMANCE") == "1"
    if selected:
        return
    skip = pytest.mark.skip(reason="slow conformance run: select with -m conformance or DDP_CONFORMANCE=1")
    for item in items:
        if item.get_closest_marker("conformance") is not None and any(f in str(item.fspath) for f in SLOW_FOLDERS):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
