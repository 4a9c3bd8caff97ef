"""A few corpus cases at 2 processes: Lightning `ddp_spawn` against our `ddp` (gloo, CPU).

Hooks run in worker processes; each rank's record is a file under tmp_path, compared rank by rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.compare import assert_conformant, run_case
from tests.conformance.cases import CASES, TWO_PROCESS_CASES


@pytest.mark.conformance
@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", TWO_PROCESS_CASES)
def test_case_conforms_at_two_processes(name: str, tmp_path: Path) -> None:
    lightning, ours = run_case(CASES[name], tmp_path, processes=2)
    assert_conformant(name, lightning, ours)
