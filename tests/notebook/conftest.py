"""The notebook tests need a Jupyter kernel (ipykernel, nbclient, nbformat: the dev extras); the
comparison with Lightning's `ddp_notebook` is a `conformance` run, skipped unless selected
(`pytest -m conformance tests/notebook` or DDP_CONFORMANCE=1), by tests/conformance's own rule."""

from __future__ import annotations

import pytest

from tests.conformance.conftest import pytest_collection_modifyitems, pytest_configure

__all__ = ["pytest_collection_modifyitems", "pytest_configure"]

pytest.importorskip("nbclient", reason="the notebook tests drive a Jupyter kernel: pip install -e .[dev]")
pytest.importorskip("ipykernel", reason="the notebook tests drive a Jupyter kernel: pip install -e .[dev]")
