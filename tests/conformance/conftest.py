"""The differential runs against Lightning: one CPU thread per test, as each rank has.

The `conformance` marker that keeps their slow part out of `make test` is defined for the whole
suite in tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
