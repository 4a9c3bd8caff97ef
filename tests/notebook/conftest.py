"""The notebook tests need a Jupyter kernel (ipykernel, nbclient, nbformat: the dev extras). Their slow
part (the failures, the interrupt, the comparison with Lightning's `ddp_notebook`) is a `conformance`
run, skipped unless selected (`pytest -m conformance tests/notebook` or DDP_CONFORMANCE=1) by the marker
tests/conftest.py defines for the whole suite."""

from __future__ import annotations

import pytest

pytest.importorskip("nbclient", reason="the notebook tests drive a Jupyter kernel: pip install -e .[dev]")
pytest.importorskip("ipykernel", reason="the notebook tests drive a Jupyter kernel: pip install -e .[dev]")
