"""Under torchrun the process outlives a stage: fit -> test -> fit must reuse the process group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
@pytest.mark.conformance
def test_several_stages_in_one_torchrun_job(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "tests.helpers.torchrun_two_stages", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    losses = [(tmp_path / f"rank{rank}.txt").read_text() for rank in range(2)]
    assert losses[0] == losses[1]  # sync_dist: both ranks report the global test loss
