"""The slow differential runs (2 processes, the long tail of the corpus) carry the `conformance` marker
(tests/conftest.py): skipped unless selected, so `make test` stays within its time budget on 2 cores."""

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
